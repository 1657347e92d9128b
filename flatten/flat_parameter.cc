#include "flatten/flat_parameter.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/status_macros.h"

namespace flatten {
namespace {

// "FlatParameter" or "FlatParameter <label>": what this flat parameter's errors name.
std::string ContextFor(absl::string_view label) {
  return label.empty() ? std::string("FlatParameter") : absl::StrCat("FlatParameter ", label);
}

// The distinct parameters Flatten lays out, in order, and what it learnt checking them.
struct CollectedParameters {
  std::vector<ParamRecord> records;           // name, shape, numel, requires_grad; not yet laid out
  std::vector<core::ParameterPtr> params;     // parallel to records
  core::DType dtype = core::DType::kFloat32;  // the first parameter's, which all share
  core::Device device = core::Device::Cpu();  // likewise
  size_t deferred = 0;                        // how many of them are deferred
};

// InvalidArgument opening with `prefix` unless `p` can be flattened on its own: a
// deferred parameter needs its recipe, any other defined data; either needs a float dtype.
absl::Status CheckParameterData(const std::string& name, const core::Parameter& p,
                                const std::string& prefix) {
  if (p.deferred()) {
    // NOTE [Deferred initialisation] (core/param_init.h): filled from its recipe.
    if (p.init == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "parameter '", name, "' is deferred but has no initialiser (ParamInit)"));
    }
  } else if (!p.data.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "parameter '", name, "' has undefined data"));
  }
  if (!core::IsFloat(p.data.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "parameter '", name, "' is ",
                                                   core::DTypeName(p.data.dtype()),
                                                   "; a FlatParameter holds float32 or bfloat16"));
  }
  return absl::OkStatus();
}

// Checks `params` and lists each distinct parameter once, at its first position and
// under its first name (NOTE [Flat layout]). InvalidArgument opening with `prefix` for a
// null parameter, two different ones under one name, a failed CheckParameterData, or a
// dtype or device other than the first parameter's.
absl::StatusOr<CollectedParameters> CollectParameters(
    const std::vector<core::NamedParameter>& params, const std::string& prefix) {
  CollectedParameters out;
  absl::flat_hash_map<std::string, const core::Parameter*> by_name;
  absl::flat_hash_map<const core::Parameter*, std::string> first_name;
  for (const auto& [name, p] : params) {
    if (p == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "parameter '", name, "' is null"));
    }
    auto [it, inserted] = by_name.emplace(name, p.get());
    if (!inserted && it->second != p.get()) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "two different parameters are named '",
                                                     name, "'; names must be unique"));
    }
    if (!first_name.emplace(p.get(), name).second) continue;  // tied: listed once
    RETURN_IF_ERROR(CheckParameterData(name, *p, prefix));
    if (p->deferred()) ++out.deferred;
    if (out.params.empty()) {
      out.dtype = p->data.dtype();
      out.device = p->data.device();
    } else {
      const std::string& first = out.records.front().name;
      if (p->data.dtype() != out.dtype) {
        return absl::InvalidArgumentError(absl::StrCat(
            prefix, "parameter '", name, "' is ", core::DTypeName(p->data.dtype()), " but '", first,
            "' is ", core::DTypeName(out.dtype), "; a FlatParameter holds one dtype"));
      }
      if (p->data.device() != out.device) {
        return absl::InvalidArgumentError(absl::StrCat(
            prefix, "parameter '", name, "' is on ", p->data.device().ToString(), " but '", first,
            "' is on ", out.device.ToString(), "; a FlatParameter holds one device"));
      }
    }
    ParamRecord record;
    record.name = name;
    record.shape = p->data.shape();
    record.numel = p->data.numel();
    record.requires_grad = p->requires_grad;
    out.records.push_back(std::move(record));
    out.params.push_back(p);
  }
  return out;
}

// The flat buffer's size: the parameters' elements, and those rounded up to a multiple
// of the world size.
struct FlatSizes {
  int64_t numel = 0;
  int64_t padded_numel = 0;
};

// Lays `records` out back to back (NOTE [Flat layout]): sets each one's offset and its
// slice of every rank's shard. `context` names the unit in errors.
absl::StatusOr<FlatSizes> LayOut(std::vector<ParamRecord>& records, int world_size,
                                 const std::string& context) {
  std::vector<int64_t> numels;
  for (const ParamRecord& record : records) numels.push_back(record.numel);
  absl::StatusOr<std::vector<int64_t>> offsets = FlatOffsets(numels);
  RETURN_IF_ERROR(core::Annotate(offsets.status(), context));
  FlatSizes sizes;
  for (int64_t n : numels) sizes.numel += n;
  absl::StatusOr<int64_t> padded = PaddedNumel(sizes.numel, world_size);
  RETURN_IF_ERROR(core::Annotate(padded.status(), context));
  sizes.padded_numel = *padded;
  for (size_t i = 0; i < records.size(); ++i) {
    ParamRecord& record = records[i];
    record.offset = (*offsets)[i];
    ASSIGN_OR_RETURN(record.shards,
                     ShardSlices(record.offset, record.numel, sizes.numel, world_size));
  }
  return sizes;
}

// InvalidArgument opening with `prefix`, naming the first materialized parameter, when
// some but not all of the parameters are deferred.
absl::Status CheckAllOrNoneDeferred(const CollectedParameters& collected,
                                    const std::string& prefix) {
  if (collected.deferred == 0 || collected.deferred == collected.params.size()) {
    return absl::OkStatus();
  }
  for (size_t i = 0; i < collected.params.size(); ++i) {
    if (!collected.params[i]->deferred()) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "parameter '", collected.records[i].name, "' is materialized but ",
          collected.deferred,
          " other parameters of this unit are deferred; a unit's parameters are either all "
          "deferred or all materialized"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<FlatParameter>> FlatParameter::Flatten(
    const std::vector<core::NamedParameter>& params, int world_size, int rank,
    const FlattenOptions& options) {
  const std::string context = ContextFor(options.label);
  const std::string prefix = absl::StrCat(context, ": ");
  RETURN_IF_ERROR(core::Annotate(CheckRank(rank, world_size), context));

  // Validate everything and build the records before touching any parameter.
  ASSIGN_OR_RETURN(CollectedParameters collected, CollectParameters(params, prefix));
  ASSIGN_OR_RETURN(const FlatSizes sizes, LayOut(collected.records, world_size, context));
  RETURN_IF_ERROR(CheckAllOrNoneDeferred(collected, prefix));

  auto flat = absl::WrapUnique(new FlatParameter());
  flat->label_ = options.label;
  flat->shard_on_host_ = options.shard_on_host;
  flat->world_size_ = world_size;
  flat->rank_ = rank;
  flat->dtype_ = collected.dtype;
  flat->device_ = collected.device;
  flat->numel_ = sizes.numel;
  flat->padded_numel_ = sizes.padded_numel;
  flat->shard_numel_ = sizes.padded_numel / world_size;
  flat->records_ = std::move(collected.records);
  flat->params_ = std::move(collected.params);
  if (collected.deferred > 0) {
    RETURN_IF_ERROR(flat->MaterializeShard(context));
  } else {
    RETURN_IF_ERROR(flat->CopyInParameters(context));
  }
  return flat;
}

absl::Status FlatParameter::CopyInParameters(const std::string& context) {
  // One allocation for the full buffer, one for the shard; copy each parameter in once.
  const int64_t element_size = core::DTypeSize(dtype_);
  absl::StatusOr<core::Tensor> full =
      core::Tensor::Allocate({padded_numel_}, dtype_, core::MemoryTag::kParam, device_);
  RETURN_IF_ERROR(core::Annotate(full.status(), context));
  full_ = *std::move(full);
  for (size_t i = 0; i < records_.size(); ++i) {
    const ParamRecord& record = records_[i];
    if (record.numel == 0) continue;
    ASSIGN_OR_RETURN(core::Tensor slot, full_.View(record.offset, {record.numel}));
    RETURN_IF_ERROR(core::Annotate(slot.CopyFrom(params_[i]->data),
                                   absl::StrCat(context, ": copying '", record.name, "'")));
    bytes_copied_ += record.numel * element_size;
  }
  ASSIGN_OR_RETURN(core::Tensor padding, full_.View(numel_, {padded_numel_ - numel_}));
  padding.Zero();
  full_filled_ = true;

  absl::StatusOr<core::Tensor> shard = AllocateShardBuffer(core::MemoryTag::kParam);
  RETURN_IF_ERROR(core::Annotate(shard.status(), context));
  shard_ = *std::move(shard);
  RETURN_IF_ERROR(CopyFullToShard());

  // Re-point: data at full-shape views, gradients dropped.
  ASSIGN_OR_RETURN(std::vector<core::Tensor> views,
                   MakeViews(full_, /*full_shape=*/true, /*skip_frozen=*/false));
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i]->data = std::move(views[i]);
    params_[i]->grad = core::Tensor();
  }
  return absl::OkStatus();
}

absl::Status FlatParameter::MaterializeShard(const std::string& context) {
  if (dtype_ != core::DType::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat(context, ": deferred parameters are materialized as float32; '",
                     records_.front().name, "' is ", core::DTypeName(dtype_)));
  }
  // Filled on the host (the recipes run there), then copied to the device if it is one.
  const bool on_host = shard_device().is_cpu();
  absl::StatusOr<core::Tensor> shard =
      on_host ? AllocateShardBuffer(core::MemoryTag::kParam)
              : core::Tensor::Allocate({shard_numel_}, dtype_, core::MemoryTag::kOther,
                                       core::Device::Cpu());
  RETURN_IF_ERROR(core::Annotate(shard.status(), context));
  shard->Zero();  // the padding
  for (size_t i = 0; i < records_.size(); ++i) {
    const ParamRecord& record = records_[i];
    const ShardSlice& slice = record.shards[rank_];
    if (slice.empty()) continue;
    ASSIGN_OR_RETURN(core::Tensor part, shard->View(slice.shard_offset, {slice.numel()}));
    RETURN_IF_ERROR(core::Annotate(params_[i]->init->Fill(part, slice.begin),
                                   absl::StrCat(context, ": initialising '", record.name, "'")));
  }
  if (!on_host) {
    absl::StatusOr<core::Tensor> on_device = AllocateShardBuffer(core::MemoryTag::kParam);
    RETURN_IF_ERROR(core::Annotate(on_device.status(), context));
    RETURN_IF_ERROR(core::Annotate(on_device->CopyFrom(*shard), context));
    shard = std::move(on_device);
  }
  shard_ = *std::move(shard);
  ASSIGN_OR_RETURN(std::vector<core::Tensor> views,
                   MakeViews(shard_, /*full_shape=*/false, /*skip_frozen=*/false));
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i]->data = std::move(views[i]);
    params_[i]->grad = core::Tensor();
  }
  return absl::OkStatus();
}

const ParamRecord* FlatParameter::FindRecord(absl::string_view name) const {
  for (const ParamRecord& record : records_) {
    if (record.name == name) return &record;
  }
  return nullptr;
}

std::string FlatParameter::Context() const { return ContextFor(label_); }

std::string FlatParameter::Prefix() const { return absl::StrCat(Context(), ": "); }

absl::Status FlatParameter::CheckManaged(absl::string_view op) const {
  if (unflattened_) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(), op, " after Unflatten: the parameters are no longer managed"));
  }
  return absl::OkStatus();
}

absl::Status FlatParameter::CheckFloatDType(core::DType dtype, absl::string_view op) const {
  if (!core::IsFloat(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(Prefix(), op, "(", core::DTypeName(dtype),
                                                   "): the dtype must be float32 or bfloat16"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<core::Tensor>> FlatParameter::MakeViews(const core::Tensor& buffer,
                                                                   bool full_shape,
                                                                   bool skip_frozen) const {
  std::vector<core::Tensor> views(records_.size());
  for (size_t i = 0; i < records_.size(); ++i) {
    const ParamRecord& record = records_[i];
    if (skip_frozen && !record.requires_grad) continue;
    const ShardSlice& slice = record.shards[rank_];
    absl::StatusOr<core::Tensor> view = full_shape
                                            ? buffer.View(record.offset, record.shape)
                                            : buffer.View(slice.shard_offset, {slice.numel()});
    if (!view.ok()) {
      return core::Annotate(view.status(), absl::StrCat(Prefix(), "view of '", record.name, "'"));
    }
    views[i] = *std::move(view);
  }
  return views;
}

absl::Status FlatParameter::CheckNotViewed(const core::Tensor& buffer, bool grads,
                                           absl::string_view what, absl::string_view remedy) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    const core::Tensor& t = grads ? params_[i]->grad : params_[i]->data;
    if (t.SharesStorage(buffer)) {
      return absl::FailedPreconditionError(absl::StrCat(Prefix(), "cannot free the ", what,
                                                        ": parameter '", records_[i].name,
                                                        "' still views it; ", remedy));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<core::Tensor> FlatParameter::AllocateShardBuffer(core::MemoryTag tag) const {
  if (!shard_on_host_) return core::Tensor::Allocate({shard_numel_}, dtype_, tag, device_);
  core::ScopedAllocator pinned(core::Allocator::PinnedHost());
  return core::Tensor::Allocate({shard_numel_}, dtype_, tag, core::Device::Cpu());
}

// --- Full buffer ---

absl::Status FlatParameter::AllocateFull(core::DType dtype) {
  RETURN_IF_ERROR(CheckManaged("AllocateFull"));
  RETURN_IF_ERROR(CheckFloatDType(dtype, "AllocateFull"));
  if (full_.defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(), "AllocateFull: the full buffer is already allocated (",
                     core::DTypeName(full_.dtype()), "); FreeFull it first"));
  }
  absl::StatusOr<core::Tensor> full =
      core::Tensor::Allocate({padded_numel_}, dtype, core::MemoryTag::kParam, device_);
  RETURN_IF_ERROR(core::Annotate(full.status(), Context()));
  full_ = *std::move(full);
  full_filled_ = false;
  return absl::OkStatus();
}

absl::Status FlatParameter::MarkFullFilled() {
  RETURN_IF_ERROR(CheckManaged("MarkFullFilled"));
  if (!full_.defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(), "MarkFullFilled: the full buffer is not allocated"));
  }
  full_filled_ = true;
  return absl::OkStatus();
}

absl::Status FlatParameter::FreeFull() {
  RETURN_IF_ERROR(CheckManaged("FreeFull"));
  if (!full_.defined()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckNotViewed(full_, /*grads=*/false, "full buffer", "call ShardViews() first"));
  full_ = core::Tensor();
  full_filled_ = false;
  return absl::OkStatus();
}

absl::StatusOr<core::Tensor> FlatParameter::LocalChunkOfFull() const {
  RETURN_IF_ERROR(CheckManaged("LocalChunkOfFull"));
  if (!full_.defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(), "LocalChunkOfFull: the full buffer is not allocated"));
  }
  return full_.View(rank_ * shard_numel_, {shard_numel_});
}

absl::Status FlatParameter::CopyFullToShard() {
  RETURN_IF_ERROR(CheckManaged("CopyFullToShard"));
  if (!full_filled_) {
    return absl::FailedPreconditionError(absl::StrCat(
        Prefix(), "CopyFullToShard: the full buffer is ",
        full_.defined() ? "allocated but not marked filled (call MarkFullFilled after filling it)"
                        : "not allocated"));
  }
  if (full_.dtype() != dtype_) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(), "CopyFullToShard: the full buffer is ",
                     core::DTypeName(full_.dtype()), " but the shard is ", core::DTypeName(dtype_),
                     "; copying would overwrite the master values with rounded ones"));
  }
  ASSIGN_OR_RETURN(core::Tensor chunk, LocalChunkOfFull());
  RETURN_IF_ERROR(core::Annotate(shard_.CopyFrom(chunk), Context()));
  bytes_copied_ += shard_.nbytes();
  return absl::OkStatus();
}

absl::Status FlatParameter::CopyShardToFull() {
  RETURN_IF_ERROR(CheckManaged("CopyShardToFull"));
  if (!full_.defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(), "CopyShardToFull: the full buffer is not allocated"));
  }
  ASSIGN_OR_RETURN(core::Tensor chunk, LocalChunkOfFull());
  RETURN_IF_ERROR(core::Annotate(chunk.CopyFrom(shard_), Context()));
  bytes_copied_ += chunk.nbytes();
  if (world_size_ == 1) full_filled_ = true;
  return absl::OkStatus();
}

// --- Parameter views ---

absl::Status FlatParameter::FullViews() {
  RETURN_IF_ERROR(CheckManaged("FullViews"));
  if (!full_.defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(),
                     "FullViews: the full buffer is not allocated; call AllocateFull and fill it "
                     "first"));
  }
  ASSIGN_OR_RETURN(std::vector<core::Tensor> views,
                   MakeViews(full_, /*full_shape=*/true, /*skip_frozen=*/false));
  for (size_t i = 0; i < params_.size(); ++i) params_[i]->data = std::move(views[i]);
  return absl::OkStatus();
}

absl::Status FlatParameter::ShardViews() {
  RETURN_IF_ERROR(CheckManaged("ShardViews"));
  ASSIGN_OR_RETURN(std::vector<core::Tensor> views,
                   MakeViews(shard_, /*full_shape=*/false, /*skip_frozen=*/false));
  for (size_t i = 0; i < params_.size(); ++i) params_[i]->data = std::move(views[i]);
  return absl::OkStatus();
}

// --- Gradients ---

absl::Status FlatParameter::AllocateFullGrad(core::DType dtype) {
  RETURN_IF_ERROR(CheckManaged("AllocateFullGrad"));
  RETURN_IF_ERROR(CheckFloatDType(dtype, "AllocateFullGrad"));
  if (full_grad_.defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(), "AllocateFullGrad: the full gradient buffer is already allocated (",
                     core::DTypeName(full_grad_.dtype()), "); FreeFullGrad it first"));
  }
  absl::StatusOr<core::Tensor> grad =
      core::Tensor::Allocate({padded_numel_}, dtype, core::MemoryTag::kGrad, device_);
  RETURN_IF_ERROR(core::Annotate(grad.status(), Context()));
  grad->Zero();
  full_grad_ = *std::move(grad);
  return absl::OkStatus();
}

absl::Status FlatParameter::UseShardGradAsFullGrad() {
  RETURN_IF_ERROR(CheckManaged("UseShardGradAsFullGrad"));
  if (full_grad_.defined()) {
    return absl::FailedPreconditionError(absl::StrCat(
        Prefix(), "UseShardGradAsFullGrad: the full gradient buffer is already allocated"));
  }
  if (world_size_ != 1 || shard_numel_ != padded_numel_) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(), "UseShardGradAsFullGrad needs world_size 1, got ", world_size_));
  }
  if (!shard_grad_.defined() || shard_grad_.dtype() != core::DType::kFloat32) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(), "UseShardGradAsFullGrad needs the fp32 gradient shard, got ",
                     shard_grad_.defined() ? shard_grad_.ToString() : std::string("none"),
                     "; AllocateShardGrad first"));
  }
  full_grad_ = shard_grad_;
  full_grad_is_shard_grad_ = true;
  return absl::OkStatus();
}

absl::Status FlatParameter::FreeFullGrad() {
  RETURN_IF_ERROR(CheckManaged("FreeFullGrad"));
  if (!full_grad_.defined()) return absl::OkStatus();
  if (full_grad_is_shard_grad_) {
    full_grad_ = core::Tensor();
    full_grad_is_shard_grad_ = false;
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(CheckNotViewed(full_grad_, /*grads=*/true, "full gradient buffer",
                                 "call ShardGradViews() or ClearGradViews() first"));
  full_grad_ = core::Tensor();
  return absl::OkStatus();
}

absl::StatusOr<core::Tensor> FlatParameter::LocalChunkOfFullGrad() const {
  RETURN_IF_ERROR(CheckManaged("LocalChunkOfFullGrad"));
  if (!full_grad_.defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(), "LocalChunkOfFullGrad: the full gradient buffer is not allocated"));
  }
  return full_grad_.View(rank_ * shard_numel_, {shard_numel_});
}

absl::Status FlatParameter::AllocateShardGrad() {
  RETURN_IF_ERROR(CheckManaged("AllocateShardGrad"));
  if (shard_grad_.defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(), "AllocateShardGrad: the gradient shard is already allocated"));
  }
  absl::StatusOr<core::Tensor> grad = AllocateShardBuffer(core::MemoryTag::kGrad);
  RETURN_IF_ERROR(core::Annotate(grad.status(), Context()));
  grad->Zero();
  shard_grad_ = *std::move(grad);
  return absl::OkStatus();
}

absl::Status FlatParameter::FreeShardGrad() {
  RETURN_IF_ERROR(CheckManaged("FreeShardGrad"));
  if (!shard_grad_.defined()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckNotViewed(shard_grad_, /*grads=*/true, "gradient shard",
                                 "call FullGradViews() or ClearGradViews() first"));
  if (full_grad_is_shard_grad_) {  // the full gradient buffer goes with it
    full_grad_ = core::Tensor();
    full_grad_is_shard_grad_ = false;
  }
  shard_grad_ = core::Tensor();
  return absl::OkStatus();
}

absl::Status FlatParameter::CopyFullGradToShardGrad() {
  RETURN_IF_ERROR(CheckManaged("CopyFullGradToShardGrad"));
  if (!shard_grad_.defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(), "CopyFullGradToShardGrad: the gradient shard is not allocated"));
  }
  ASSIGN_OR_RETURN(core::Tensor chunk, LocalChunkOfFullGrad());
  RETURN_IF_ERROR(core::Annotate(shard_grad_.CopyFrom(chunk), Context()));
  bytes_copied_ += shard_grad_.nbytes();
  return absl::OkStatus();
}

absl::Status FlatParameter::FullGradViews() {
  RETURN_IF_ERROR(CheckManaged("FullGradViews"));
  if (!full_grad_.defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(),
                     "FullGradViews: the full gradient buffer is not allocated; call "
                     "AllocateFullGrad first"));
  }
  ASSIGN_OR_RETURN(std::vector<core::Tensor> views,
                   MakeViews(full_grad_, /*full_shape=*/true, /*skip_frozen=*/true));
  for (size_t i = 0; i < params_.size(); ++i) params_[i]->grad = std::move(views[i]);
  return absl::OkStatus();
}

absl::Status FlatParameter::ShardGradViews() {
  RETURN_IF_ERROR(CheckManaged("ShardGradViews"));
  if (!shard_grad_.defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(),
                     "ShardGradViews: the gradient shard is not allocated; call "
                     "AllocateShardGrad first"));
  }
  ASSIGN_OR_RETURN(std::vector<core::Tensor> views,
                   MakeViews(shard_grad_, /*full_shape=*/false, /*skip_frozen=*/true));
  for (size_t i = 0; i < params_.size(); ++i) params_[i]->grad = std::move(views[i]);
  return absl::OkStatus();
}

absl::Status FlatParameter::ClearGradViews() {
  RETURN_IF_ERROR(CheckManaged("ClearGradViews"));
  for (const core::ParameterPtr& p : params_) p->grad = core::Tensor();
  return absl::OkStatus();
}

// --- Unflatten ---

absl::Status FlatParameter::Unflatten() {
  RETURN_IF_ERROR(CheckManaged("Unflatten"));
  if (!full_.defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(),
                     "Unflatten needs the full values, but the full buffer is not allocated; "
                     "call AllocateFull(",
                     core::DTypeName(dtype_),
                     "), gather every rank's shard into it and call MarkFullFilled() first"));
  }
  if (!full_filled_) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(),
                     "Unflatten needs the full values, but the full buffer was allocated and "
                     "not marked filled; gather every rank's shard into it and call "
                     "MarkFullFilled() first"));
  }
  if (full_.dtype() != dtype_) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(), "Unflatten: the full buffer is ", core::DTypeName(full_.dtype()),
                     " but the parameters are ", core::DTypeName(dtype_),
                     "; unflattening from it would lose precision; gather the shards into a ",
                     core::DTypeName(dtype_), " full buffer instead"));
  }
  // Allocate and fill everything first, so that an error changes nothing.
  const int64_t element_size = core::DTypeSize(dtype_);
  std::vector<core::Tensor> data(records_.size());
  std::vector<core::Tensor> grads(records_.size());
  int64_t copied = 0;
  for (size_t i = 0; i < records_.size(); ++i) {
    const ParamRecord& record = records_[i];
    const std::string where = absl::StrCat(Prefix(), "Unflatten '", record.name, "'");
    absl::StatusOr<core::Tensor> own =
        core::Tensor::Allocate(record.shape, dtype_, core::MemoryTag::kParam, device_);
    RETURN_IF_ERROR(core::Annotate(own.status(), where));
    ASSIGN_OR_RETURN(core::Tensor view, full_.View(record.offset, {record.numel}));
    RETURN_IF_ERROR(core::Annotate(own->CopyFrom(view), where));
    copied += record.numel * element_size;
    data[i] = *std::move(own);
    if (full_grad_.defined() && record.requires_grad) {
      absl::StatusOr<core::Tensor> grad =
          core::Tensor::Allocate(record.shape, dtype_, core::MemoryTag::kGrad, device_);
      RETURN_IF_ERROR(core::Annotate(grad.status(), where));
      ASSIGN_OR_RETURN(core::Tensor grad_view, full_grad_.View(record.offset, {record.numel}));
      RETURN_IF_ERROR(core::Annotate(grad->CopyFrom(grad_view), where));
      copied += record.numel * element_size;
      grads[i] = *std::move(grad);
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i]->data = std::move(data[i]);
    params_[i]->grad = std::move(grads[i]);
  }
  bytes_copied_ += copied;
  params_.clear();
  full_ = core::Tensor();
  full_filled_ = false;
  shard_ = core::Tensor();
  full_grad_ = core::Tensor();
  full_grad_is_shard_grad_ = false;
  shard_grad_ = core::Tensor();
  unflattened_ = true;
  return absl::OkStatus();
}

}  // namespace flatten
