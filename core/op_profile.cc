#include "core/op_profile.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/timing_event.h"

#ifdef FSDP_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace core {
namespace {

thread_local OpProfile* current_profile = nullptr;
thread_local int category_override = -1;

// ScopedOpCategory's rule: a GEMM takes the scope's category.
OpCategory Resolve(OpCategory category) {
  if (category == OpCategory::kGemmForward && category_override >= 0) {
    return static_cast<OpCategory>(category_override);
  }
  return category;
}

// A timing event recorded on the compute stream of `device` (core/timing_event.h), or
// nullptr when it cannot be made (the op is then recorded without a device time).
void* RecordEvent(Device device) {
  return RecordTimingEvent(device, "op profile").value_or(nullptr);
}

// The same on the calling thread's current CUDA device (an op's end, on its start's device).
void* RecordEventOnCurrentDevice() {
#ifdef FSDP_WITH_CUDA
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return nullptr;
  return RecordEvent(Device::Cuda(device));
#else
  return nullptr;
#endif
}

}  // namespace

const char* OpCategoryName(OpCategory category) {
  switch (category) {
    case OpCategory::kGemmForward:
      return "gemm.forward";
    case OpCategory::kGemmInputGrad:
      return "gemm.input_grad";
    case OpCategory::kGemmWeightGrad:
      return "gemm.weight_grad";
    case OpCategory::kAttention:
      return "attention";
    case OpCategory::kNorm:
      return "norm";
    case OpCategory::kElementwise:
      return "elementwise";
    case OpCategory::kEmbedding:
      return "embedding";
    case OpCategory::kLoss:
      return "loss";
    case OpCategory::kOptimizer:
      return "optimizer";
    case OpCategory::kConvert:
      return "convert";
    case OpCategory::kCollective:
      return "collective";
    case OpCategory::kHostSync:
      return "host_sync";
  }
  return "unknown";
}

const char* OpEngineName(OpEngine engine) {
  switch (engine) {
    case OpEngine::kTensorCoreBf16:
      return "tensor_core_bf16";
    case OpEngine::kSimtFp32:
      return "simt_fp32";
    case OpEngine::kMemory:
      return "memory";
    case OpEngine::kCollective:
      return "collective";
    case OpEngine::kHostSync:
      return "host_sync";
    case OpEngine::kTensorCoreMma:
      return "tensor_core_mma";
    case OpEngine::kMemoryRows:
      return "memory_rows";
  }
  return "unknown";
}

std::optional<OpCategory> OpCategoryFromName(absl::string_view name) {
  for (int i = 0; i < kNumOpCategories; ++i) {
    if (name == OpCategoryName(static_cast<OpCategory>(i))) return static_cast<OpCategory>(i);
  }
  return std::nullopt;
}

std::optional<OpEngine> OpEngineFromName(absl::string_view name) {
  for (int i = 0; i < kNumOpEngines; ++i) {
    if (name == OpEngineName(static_cast<OpEngine>(i))) return static_cast<OpEngine>(i);
  }
  return std::nullopt;
}

OpProfile::OpProfile() = default;

OpProfile::~OpProfile() { Clear(); }

void OpProfile::Clear() {
  for (const auto& pair : events_) {
    DestroyTimingEvent(pair[0]);
    DestroyTimingEvent(pair[1]);
  }
  events_.clear();
  records_.clear();
}

int64_t OpProfile::Append(OpRecord record) {
  records_.push_back(std::move(record));
  events_.push_back({nullptr, nullptr});
  return static_cast<int64_t>(records_.size()) - 1;
}

void OpProfile::SetEvents(int64_t index, void* start, void* end) { events_[index] = {start, end}; }

std::vector<OpCategoryTotal> OpProfile::TotalsOf(const std::vector<OpRecord>& records) {
  std::vector<OpCategoryTotal> totals(kNumOpCategories);
  for (int c = 0; c < kNumOpCategories; ++c) totals[c].category = static_cast<OpCategory>(c);
  for (const OpRecord& r : records) {
    OpCategoryTotal& t = totals[static_cast<int>(r.category)];
    ++t.ops;
    t.launches += r.cost.launches;
    t.flops += r.cost.flops;
    t.bytes += r.cost.bytes;
    if (r.device_ms >= 0) {
      t.device_ms += r.device_ms;
      ++t.timed_ops;
    }
  }
  return totals;
}

absl::Status OpProfile::ResolveDeviceTimes() {
  for (size_t i = 0; i < records_.size(); ++i) {
    void* start = events_[i][0];
    void* end = events_[i][1];
    if (start == nullptr || end == nullptr) continue;
    const absl::StatusOr<double> ms = TimingEventMs(
        start, end, absl::StrCat("op profile: the events of op #", i, " (", records_[i].name, ")"));
    if (!ms.ok()) return ms.status();
    records_[i].device_ms = *ms;
  }
  return absl::OkStatus();
}

ScopedOpProfile::ScopedOpProfile(OpProfile* profile) : previous_(current_profile) {
  current_profile = profile;
}

ScopedOpProfile::~ScopedOpProfile() { current_profile = previous_; }

OpProfile* CurrentOpProfile() { return current_profile; }

ScopedOpCategory::ScopedOpCategory(OpCategory category) : previous_(category_override) {
  category_override = static_cast<int>(category);
}

ScopedOpCategory::~ScopedOpCategory() { category_override = previous_; }

ProfiledOp::ProfiledOp(OpCategory category, const char* name, Device device, const OpCost& cost,
                       const GemmShape& gemm)
    : profile_(current_profile) {
  if (profile_ == nullptr) return;
  record_.category = Resolve(category);
  record_.name = name;
  record_.cost = cost;
  record_.gemm = gemm;
  if (device.is_cuda()) start_ = RecordEvent(device);
}

ProfiledOp::~ProfiledOp() {
  if (profile_ == nullptr) return;
  void* end = nullptr;
  if (start_ != nullptr) {
    end = RecordEventOnCurrentDevice();
    if (end == nullptr) {
      DestroyTimingEvent(start_);
      start_ = nullptr;
    }
  }
  const int64_t index = profile_->Append(std::move(record_));
  profile_->SetEvents(index, start_, end);
}

void RecordOp(OpCategory category, const char* name, const OpCost& cost) {
  OpProfile* profile = current_profile;
  if (profile == nullptr) return;
  OpRecord record;
  record.category = Resolve(category);
  record.name = name;
  record.cost = cost;
  profile->Append(std::move(record));
}

}  // namespace core
