#include "comm/process_group.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "kernels/cpu/kernels.h"

namespace comm {
namespace {

// floor(bytes * (n - 1) / n) without overflow.
int64_t ScaledShare(int64_t bytes, int n) {
  return (bytes / n) * (n - 1) + ((bytes % n) * (n - 1)) / n;
}

std::string Desc(const core::Tensor& t) {
  return absl::StrCat(t.numel(), " ", core::DTypeName(t.dtype()), " elements ",
                      core::ShapeToString(t.shape()));
}

absl::Status Invalid(const ProcessGroup& group, CollectiveKind kind, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(CollectiveKindName(kind), " on ", group.Describe(), ": ", what));
}

// Byte range [begin, end) of `t` within its storage.
std::pair<int64_t, int64_t> ByteRange(const core::Tensor& t) {
  const int64_t begin = t.offset() * core::DTypeSize(t.dtype());
  return {begin, begin + t.nbytes()};
}

bool Overlap(const core::Tensor& a, const core::Tensor& b) {
  if (!a.SharesStorage(b) || a.numel() == 0 || b.numel() == 0) return false;
  const auto [a0, a1] = ByteRange(a);
  const auto [b0, b1] = ByteRange(b);
  return a0 < b1 && b0 < a1;
}

// Whether `part` is exactly chunk `index` (of part.numel() elements) of `whole`.
bool IsChunk(const core::Tensor& part, const core::Tensor& whole, int index) {
  return part.SharesStorage(whole) && part.dtype() == whole.dtype() &&
         part.offset() == whole.offset() + index * part.numel();
}

absl::Status CheckDefined(const ProcessGroup& group, CollectiveKind kind, const core::Tensor& t,
                          absl::string_view role) {
  if (!t.defined()) return Invalid(group, kind, absl::StrCat(role, " tensor is undefined"));
  return absl::OkStatus();
}

absl::Status CheckTimeout(const ProcessGroup& group, CollectiveKind kind, absl::Duration t) {
  if (t <= absl::ZeroDuration()) {
    return Invalid(group, kind,
                   absl::StrCat("options.timeout must be positive, got ", absl::FormatDuration(t)));
  }
  return absl::OkStatus();
}

absl::Status CheckReducible(const ProcessGroup& group, CollectiveKind kind, core::DType dtype,
                            ReduceOp op) {
  if (dtype == core::DType::kInt32 && op == ReduceOp::kAverage) {
    return Invalid(group, kind, "options.reduce_op average is not defined for int32 tensors");
  }
  return absl::OkStatus();
}

}  // namespace

std::string ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAverage:
      return "average";
    case ReduceOp::kMax:
      return "max";
  }
  return "unknown";
}

std::string CollectiveKindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather:
      return "AllGather";
    case CollectiveKind::kReduceScatter:
      return "ReduceScatter";
    case CollectiveKind::kAllReduce:
      return "AllReduce";
    case CollectiveKind::kBroadcast:
      return "Broadcast";
    case CollectiveKind::kBarrier:
      return "Barrier";
  }
  return "unknown";
}

CollectiveStats CommStats::Total() const {
  CollectiveStats t;
  for (const CollectiveStats& s : by_kind) {
    t.calls += s.calls;
    t.bytes_sent += s.bytes_sent;
    t.bytes_received += s.bytes_received;
  }
  return t;
}

std::string CommStats::ToString() const {
  std::vector<std::string> parts;
  for (int k = 0; k < kNumCollectiveKinds; ++k) {
    const CollectiveStats& s = by_kind[k];
    if (s.calls == 0) continue;
    parts.push_back(absl::StrCat(CollectiveKindName(static_cast<CollectiveKind>(k)), ": ", s.calls,
                                 " calls, ", core::FormatBytes(s.bytes_sent), " sent, ",
                                 core::FormatBytes(s.bytes_received), " received"));
  }
  return parts.empty() ? "no collectives" : absl::StrJoin(parts, "; ");
}

Traffic ExpectedTraffic(CollectiveKind kind, int64_t bytes, int size, int rank, int root) {
  Traffic t;
  if (size <= 1) return t;
  switch (kind) {
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter:
      t.sent = t.received = ScaledShare(bytes, size);
      break;
    case CollectiveKind::kAllReduce:
      t.sent = t.received = ScaledShare(2 * bytes, size);
      break;
    case CollectiveKind::kBroadcast:
      t.received = rank == root ? 0 : bytes;
      t.sent = rank == (root - 1 + size) % size ? 0 : bytes;
      break;
    case CollectiveKind::kBarrier:
      break;
  }
  return t;
}

void StatsRecorder::Record(CollectiveKind kind, const Traffic& traffic) {
  absl::MutexLock lock(&mu_);
  CollectiveStats& s = stats_.by_kind[static_cast<int>(kind)];
  ++s.calls;
  s.bytes_sent += traffic.sent;
  s.bytes_received += traffic.received;
}

CommStats StatsRecorder::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void StatsRecorder::Reset() {
  absl::MutexLock lock(&mu_);
  stats_ = CommStats();
}

std::string ProcessGroup::Describe() const {
  return absl::StrCat(backend_name(), " group '", name(), "' (rank ", rank(), " of ", size(), ")");
}

namespace {

// NOTE [Staged collectives]: the option's shape, dtype, device and aliasing: input's dtype,
// or fp32 and bf16 either way round (a conversion), never into or out of an int32 input.
absl::Status CheckStageFrom(const ProcessGroup& group, CollectiveKind kind,
                            const core::Tensor& input, const core::Tensor& output,
                            const core::Tensor& stage_from) {
  if (!stage_from.defined()) return absl::OkStatus();
  if (stage_from.numel() != input.numel() ||
      (stage_from.dtype() != input.dtype() &&
       !(core::IsFloat(stage_from.dtype()) && core::IsFloat(input.dtype()))) ||
      (!stage_from.device().is_cpu() && stage_from.device() != input.device()) ||
      Overlap(stage_from, input) || Overlap(stage_from, output)) {
    return Invalid(
        group, kind,
        absl::StrCat("options.stage_from ", Desc(stage_from), " must have input's ", input.numel(),
                     " elements, input's dtype (or fp32 and bf16 "
                     "either way), live on the host or input's device and not "
                     "overlap input ",
                     Desc(input), " or the output"));
  }
  return absl::OkStatus();
}

absl::Status CheckUnstageTo(const ProcessGroup& group, CollectiveKind kind,
                            const core::Tensor& result, const core::Tensor& unstage_to) {
  if (!unstage_to.defined()) return absl::OkStatus();
  if (unstage_to.numel() != result.numel() || unstage_to.dtype() != result.dtype() ||
      !unstage_to.device().is_cpu() || Overlap(unstage_to, result)) {
    return Invalid(group, kind,
                   absl::StrCat("options.unstage_to ", Desc(unstage_to),
                                " must be a host tensor of the result's numel and dtype, not "
                                "overlapping it: ",
                                Desc(result)));
  }
  return absl::OkStatus();
}

absl::Status CheckAccumulateInto(const ProcessGroup& group, CollectiveKind kind,
                                 const core::Tensor& input, const core::Tensor& result,
                                 const ReduceScatterOptions& options) {
  const core::Tensor& into = options.accumulate_into;
  if (!into.defined()) return absl::OkStatus();
  if (options.unstage_to.defined()) {
    return Invalid(group, kind, "options.accumulate_into and options.unstage_to are exclusive");
  }
  if (into.numel() != result.numel() || into.dtype() != core::DType::kFloat32 ||
      !core::IsFloat(result.dtype()) || into.device() != result.device() || Overlap(into, result) ||
      Overlap(into, input)) {
    return Invalid(group, kind,
                   absl::StrCat("options.accumulate_into ", Desc(into),
                                " must be fp32 with the output's numel on its device, the output "
                                "fp32 or bf16, and overlap neither the output nor the input: ",
                                Desc(result)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AccumulateOut(const core::Tensor& result, const core::Tensor& accumulate_into) {
  if (!accumulate_into.defined() || result.numel() == 0) return absl::OkStatus();
  if (!result.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.accumulate_into on the host needs a host result, got ", Desc(result)));
  }
  kernels::cpu::AddInto(accumulate_into.data<float>(), result.raw_data(),
                        result.dtype() == core::DType::kBFloat16, result.numel());
  return absl::OkStatus();
}

absl::Status StageIn(const core::Tensor& input, const core::Tensor& stage_from) {
  if (!stage_from.defined() || input.numel() == 0) return absl::OkStatus();
  return input.CopyFrom(stage_from);
}

absl::Status StageOut(const core::Tensor& result, const core::Tensor& unstage_to) {
  if (!unstage_to.defined() || result.numel() == 0) return absl::OkStatus();
  return unstage_to.CopyFrom(result);
}

absl::Status ValidateAllGather(const ProcessGroup& group, const core::Tensor& input,
                               const core::Tensor& output, const AllGatherOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kAllGather;
  RETURN_IF_ERROR(CheckDefined(group, kind, input, "input"));
  RETURN_IF_ERROR(CheckDefined(group, kind, output, "output"));
  RETURN_IF_ERROR(CheckTimeout(group, kind, options.timeout));
  if (input.dtype() != output.dtype()) {
    return Invalid(group, kind,
                   absl::StrCat("input has ", Desc(input), " but output has ", Desc(output),
                                "; dtypes must match"));
  }
  if (output.numel() != input.numel() * group.size()) {
    return Invalid(
        group, kind,
        absl::StrCat("output has ", Desc(output), " but needs input numel ", input.numel(), " x ",
                     group.size(), " ranks = ", input.numel() * group.size()));
  }
  if (Overlap(input, output) && !IsChunk(input, output, group.rank())) {
    return Invalid(group, kind,
                   absl::StrCat("input overlaps output but is not its own slot (elements [",
                                group.rank() * input.numel(), ", ",
                                (group.rank() + 1) * input.numel(), ") of the output)"));
  }
  return CheckStageFrom(group, kind, input, output, options.stage_from);
}

absl::Status ValidateReduceScatter(const ProcessGroup& group, const core::Tensor& input,
                                   const core::Tensor& output,
                                   const ReduceScatterOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kReduceScatter;
  RETURN_IF_ERROR(CheckDefined(group, kind, input, "input"));
  RETURN_IF_ERROR(CheckDefined(group, kind, output, "output"));
  RETURN_IF_ERROR(CheckTimeout(group, kind, options.timeout));
  if (input.dtype() != output.dtype()) {
    return Invalid(group, kind,
                   absl::StrCat("input has ", Desc(input), " but output has ", Desc(output),
                                "; dtypes must match"));
  }
  if (input.numel() != output.numel() * group.size()) {
    return Invalid(
        group, kind,
        absl::StrCat("input has ", Desc(input), " but needs output numel ", output.numel(), " x ",
                     group.size(), " ranks = ", output.numel() * group.size()));
  }
  if (Overlap(input, output) && !IsChunk(output, input, group.rank())) {
    return Invalid(group, kind,
                   absl::StrCat("output overlaps input but is not its own chunk (elements [",
                                group.rank() * output.numel(), ", ",
                                (group.rank() + 1) * output.numel(), ") of the input)"));
  }
  RETURN_IF_ERROR(CheckUnstageTo(group, kind, output, options.unstage_to));
  RETURN_IF_ERROR(CheckAccumulateInto(group, kind, input, output, options));
  return CheckReducible(group, kind, input.dtype(), options.reduce_op);
}

absl::Status ValidateAllReduce(const ProcessGroup& group, const core::Tensor& tensor,
                               const AllReduceOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kAllReduce;
  RETURN_IF_ERROR(CheckDefined(group, kind, tensor, "the"));
  RETURN_IF_ERROR(CheckTimeout(group, kind, options.timeout));
  RETURN_IF_ERROR(CheckUnstageTo(group, kind, tensor, options.unstage_to));
  return CheckReducible(group, kind, tensor.dtype(), options.reduce_op);
}

absl::Status ValidateBroadcast(const ProcessGroup& group, const core::Tensor& tensor,
                               const BroadcastOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kBroadcast;
  RETURN_IF_ERROR(CheckDefined(group, kind, tensor, "the"));
  RETURN_IF_ERROR(CheckTimeout(group, kind, options.timeout));
  if (options.root < 0 || options.root >= group.size()) {
    return Invalid(
        group, kind,
        absl::StrCat("options.root ", options.root, " is not a rank in [0, ", group.size(), ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateBarrier(const ProcessGroup& group, const BarrierOptions& options) {
  return CheckTimeout(group, CollectiveKind::kBarrier, options.timeout);
}

absl::Status ValidateSubgroupRanks(const ProcessGroup& group, const std::vector<int>& ranks) {
  const std::string prefix =
      absl::StrCat("NewSubgroup([", absl::StrJoin(ranks, ", "), "]) on ", group.Describe(), ": ");
  if (ranks.empty()) return absl::InvalidArgumentError(prefix + "the rank list is empty");
  std::set<int> seen;
  for (int r : ranks) {
    if (r < 0 || r >= group.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "rank ", r, " is not in [0, ", group.size(), ")"));
    }
    if (!seen.insert(r).second) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "rank ", r, " is listed twice"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SubgroupPlacement> PlaceInSubgroup(const ProcessGroup& group,
                                                  const std::vector<int>& ranks, int index) {
  RETURN_IF_ERROR(ValidateSubgroupRanks(group, ranks));
  auto it = std::find(ranks.begin(), ranks.end(), group.rank());
  if (it == ranks.end()) {
    return absl::NotFoundError(absl::StrCat("NewSubgroup([", absl::StrJoin(ranks, ", "), "]) on ",
                                            group.Describe(), ": rank ", group.rank(),
                                            " is not a member of this subgroup"));
  }
  SubgroupPlacement placement;
  placement.key_prefix = absl::StrCat("sub", index);
  placement.rank = static_cast<int>(it - ranks.begin());
  placement.size = static_cast<int>(ranks.size());
  return placement;
}

absl::Status ValidateDevice(const ProcessGroup& group, CollectiveKind kind,
                            const std::vector<const core::Tensor*>& tensors, core::Device device) {
  for (const core::Tensor* t : tensors) {
    if (t->defined() && t->device() != device) {
      return Invalid(group, kind,
                     absl::StrCat("a tensor is on ", t->device().ToString(), " but ",
                                  group.backend_name(), " works on ", device.ToString()));
    }
  }
  return absl::OkStatus();
}

}  // namespace comm
