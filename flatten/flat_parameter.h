// FlatParameter: one padded 1-D buffer holding an FSDP unit's parameters, the local
// shard of it, and the views that make each Parameter object use them.
//
// Like llm.c's malloc_and_point_parameters: one allocation, pointers into it. Flatten
// copies every parameter into a fresh padded buffer once, and from then on switching
// what `Parameter::data` (and `grad`) refers to only creates views: it allocates and
// copies nothing.
//
//   // Rank `rank` of `world`; `module` is the unit's root.
//   flatten::FlattenOptions options;
//   options.label = module->Describe();
//   ASSIGN_OR_RETURN(std::unique_ptr<flatten::FlatParameter> flat,
//                    flatten::FlatParameter::Flatten(module->NamedParameters(), world, rank,
//                                                    options));
//   // Every parameter now views flat->full(); reach the sharded steady state:
//   RETURN_IF_ERROR(flat->ShardViews());  // data = 1-D slices of flat->shard()
//   RETURN_IF_ERROR(flat->FreeFull());
//   // Before computing: allocate the full buffer, all-gather the shards into it
//   // (the caller's collective), then point the parameters at full-shape views.
//   RETURN_IF_ERROR(flat->AllocateFull(core::DType::kBFloat16));
//   ... all-gather into flat->full() ...
//   RETURN_IF_ERROR(flat->MarkFullFilled());
//   RETURN_IF_ERROR(flat->FullViews());
//
// NOTE [Flat layout]: parameters are laid out in the order given (a parameter object
// given twice, i.e. tied, once, at its first position and under its first name), back
// to back with no gaps, then the buffer is right-padded with zeros to a multiple of the
// world size (see shard_math.h). Rank r's shard is the r-th of world_size equal chunks.
//
// Memory (all through core::Allocator::Current(device) at the time of each call):
//   full buffer       padded_numel elements, dtype chosen per AllocateFull, tag kParam
//   shard             shard_numel elements, the parameters' dtype, tag kParam; lives
//                     from Flatten until Unflatten (on shard_device(): the host's
//                     pinned allocator under NOTE [Shard on the host])
//   full grad buffer  padded_numel elements, dtype chosen per AllocateFullGrad, tag kGrad
//   shard grad        shard_numel elements, the parameters' dtype, tag kGrad (on
//                     shard_device(), like the shard)
// Freeing a buffer drops this object's reference; the memory returns to the allocator
// once nothing else refers to it, which is why the Free* calls refuse while managed
// parameters still view the buffer.
//
// Not thread-safe; one FlatParameter per unit per rank, used from that rank's thread.
#ifndef FLATTEN_FLAT_PARAMETER_H_
#define FLATTEN_FLAT_PARAMETER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/module.h"
#include "core/parameter.h"
#include "core/tensor.h"
#include "flatten/shard_math.h"

namespace flatten {

// What Flatten records about one parameter. Immutable after Flatten.
struct ParamRecord {
  std::string name;           // the first name the parameter was given under
  core::Shape shape;          // its full shape
  int64_t numel = 0;          // elements in `shape` (possibly 0)
  int64_t offset = 0;         // first element in the flat buffer
  bool requires_grad = true;  // false: frozen, never gets a gradient view
  // shards[r] is the part of this parameter that rank r's shard holds (possibly empty);
  // one entry per rank, 0..world_size-1.
  std::vector<ShardSlice> shards;
};

struct FlattenOptions {
  // Names the unit in every error message, e.g. Module::Describe() of its root.
  std::string label;
  // NOTE [Shard on the host]: the shard and the gradient shard live in page-locked host
  // memory (core::Allocator::PinnedHost(), device CPU) while the full buffers stay on
  // the parameters' device; FSDP's CPU offload (NOTE [CPU offload] in fsdp/options.h).
  // The copies between them (CopyFullToShard, CopyShardToFull, ...) cross devices.
  bool shard_on_host = false;
};

class FlatParameter {
 public:
  // Builds rank `rank`'s FlatParameter of `params` for `world_size` ranks.
  //
  // Copies every distinct parameter's values once into a new padded full buffer (in the
  // parameters' dtype; padding zero), copies the local chunk into the shard, points
  // every Parameter::data at its full-shape view of the full buffer and drops every
  // existing `grad` (they would not match the flat layout; gradients start undefined).
  // On return the full buffer is allocated and filled. Allocates exactly
  // (padded_numel + shard_numel) * element size bytes under tag kParam; the parameters'
  // old storage is released as far as nothing else refers to it.
  //
  // Deferred parameters (NOTE [Deferred initialisation] in core/param_init.h: meta
  // data and a ParamInit recipe) are materialized instead: only the shard is allocated
  // (shard_numel * element size bytes, tag kParam), each parameter's slice filled from
  // its recipe at the slice's offsets, and on return every parameter views its slice of
  // the shard (as after ShardViews) with no full buffer. That gives the values a full
  // construction would, at any world size (on a CUDA device: filled on the host, then
  // copied; a host buffer of one shard meanwhile). A unit's parameters must be all
  // deferred (float32) or all materialized.
  //
  // Every parameter must be defined, fp32 or bf16, and all must share one dtype and one
  // device. InvalidArgument (naming the parameter, or the option) for: world_size < 1,
  // rank outside [0, world_size), a null or undefined parameter, int32 data, mixed
  // dtypes or devices, two different parameters under one name. Nothing is changed on
  // error.
  static absl::StatusOr<std::unique_ptr<FlatParameter>> Flatten(
      const std::vector<core::NamedParameter>& params, int world_size, int rank,
      const FlattenOptions& options = {});

  FlatParameter(const FlatParameter&) = delete;
  FlatParameter& operator=(const FlatParameter&) = delete;

  // --- Layout (fixed at Flatten) ---
  const std::string& label() const { return label_; }
  int world_size() const { return world_size_; }
  int rank() const { return rank_; }
  // The parameters' dtype, which is also the shard's (the fp32 master in FSDP).
  core::DType dtype() const { return dtype_; }
  core::Device device() const { return device_; }
  // Where the shard and the gradient shard live: device(), or the CPU under NOTE
  // [Shard on the host].
  bool shard_on_host() const { return shard_on_host_; }
  core::Device shard_device() const { return shard_on_host_ ? core::Device::Cpu() : device_; }
  // Sum of the parameters' numels, without padding.
  int64_t numel() const { return numel_; }
  // numel() rounded up to a multiple of world_size().
  int64_t padded_numel() const { return padded_numel_; }
  // padded_numel() / world_size(): elements in each rank's shard.
  int64_t shard_numel() const { return shard_numel_; }
  // One record per distinct parameter, in layout order.
  const std::vector<ParamRecord>& records() const { return records_; }
  // The managed parameter objects, parallel to records(); empty after Unflatten.
  const std::vector<core::ParameterPtr>& params() const { return params_; }
  // The record named `name`, or nullptr.
  const ParamRecord* FindRecord(absl::string_view name) const;
  // Bytes this object has copied so far (into buffers, between them, or out in
  // Unflatten). View switches never add to it.
  int64_t bytes_copied() const { return bytes_copied_; }
  // True after Unflatten: the parameters are no longer managed and every operation
  // below returns FailedPrecondition.
  bool unflattened() const { return unflattened_; }

  // --- Buffers ---
  // The padded full buffer, 1-D; undefined while freed.
  const core::Tensor& full() const { return full_; }
  // The local shard, 1-D, shard_numel() elements; undefined after Unflatten.
  const core::Tensor& shard() const { return shard_; }
  // The padded full gradient buffer and the local gradient shard; undefined while freed.
  const core::Tensor& full_grad() const { return full_grad_; }
  const core::Tensor& shard_grad() const { return shard_grad_; }

  // Allocates the padded full buffer in `dtype` (fp32 or bf16) with undefined contents.
  // FailedPrecondition if it is already allocated; InvalidArgument for another dtype.
  absl::Status AllocateFull(core::DType dtype);
  // Declares that the full buffer now holds every rank's current shard (e.g. after the
  // caller's all-gather), which Unflatten and CopyFullToShard require.
  // FailedPrecondition if it is not allocated.
  absl::Status MarkFullFilled();
  // Whether the full buffer is allocated and was filled (by Flatten, MarkFullFilled, or
  // CopyShardToFull with world_size 1) since it was allocated.
  bool full_filled() const { return full_filled_; }
  // Drops the full buffer; OK if already freed. FailedPrecondition naming the parameter
  // if a managed Parameter::data still views it (call ShardViews first).
  absl::Status FreeFull();
  // The local shard's slot in the full buffer, [rank * shard_numel, (rank + 1) *
  // shard_numel), as a view (the in-place all-gather's input). FailedPrecondition if the
  // full buffer is not allocated.
  absl::StatusOr<core::Tensor> LocalChunkOfFull() const;
  // Copies the local chunk of the full buffer into the shard. FailedPrecondition unless
  // the full buffer is filled and in dtype() (a bf16 copy would overwrite the master
  // with rounded values).
  absl::Status CopyFullToShard();
  // Writes the shard, converted to the full buffer's dtype, into its slot of the full
  // buffer; with world_size 1 this fills the full buffer. FailedPrecondition if the full
  // buffer is not allocated.
  absl::Status CopyShardToFull();

  // --- Parameter views (allocate nothing, copy nothing) ---
  // Points every Parameter::data at its full-shape view of the full buffer (in the full
  // buffer's dtype). FailedPrecondition if the full buffer is not allocated.
  absl::Status FullViews();
  // Points every Parameter::data at its 1-D slice of the local shard (numel may be 0;
  // ParamRecord::shards[rank()] says which elements).
  absl::Status ShardViews();

  // --- Gradients ---
  // Allocates the zeroed padded full gradient buffer in `dtype` (fp32 or bf16).
  // FailedPrecondition if already allocated; InvalidArgument for another dtype.
  absl::Status AllocateFullGrad(core::DType dtype);
  // With world_size 1 the gradient shard is the whole padded buffer: makes the full
  // gradient buffer that shard itself (no second buffer, nothing to zero), so what the
  // backward adds into the full views lands in the shard. FailedPrecondition unless
  // world_size() is 1, the fp32 gradient shard is allocated and the full gradient buffer
  // is not.
  absl::Status UseShardGradAsFullGrad();
  // Whether the full gradient buffer is the gradient shard (UseShardGradAsFullGrad).
  bool full_grad_is_shard_grad() const { return full_grad_is_shard_grad_; }
  // Drops it; OK if already freed. FailedPrecondition naming the parameter if a managed
  // grad still views it (call ShardGradViews or ClearGradViews first), unless it is the
  // gradient shard (which stays).
  absl::Status FreeFullGrad();
  // The local chunk of the full gradient buffer as a view (the reduce-scatter's
  // counterpart of LocalChunkOfFull). FailedPrecondition if it is not allocated.
  absl::StatusOr<core::Tensor> LocalChunkOfFullGrad() const;
  // Allocates the zeroed local gradient shard (dtype()). FailedPrecondition if already
  // allocated.
  absl::Status AllocateShardGrad();
  // Drops it; OK if already freed. FailedPrecondition naming the parameter if a managed
  // grad still views it.
  absl::Status FreeShardGrad();
  // Overwrites the shard gradient with the local chunk of the full gradient buffer
  // (converted to dtype()). FailedPrecondition unless both are allocated.
  absl::Status CopyFullGradToShardGrad();
  // Points every trainable parameter's grad at its full-shape view of the full gradient
  // buffer; frozen parameters' grads become undefined. FailedPrecondition if the full
  // gradient buffer is not allocated.
  absl::Status FullGradViews();
  // Points every trainable parameter's grad at its 1-D slice of the gradient shard;
  // frozen parameters' grads become undefined. FailedPrecondition if the gradient shard
  // is not allocated.
  absl::Status ShardGradViews();
  // Makes every managed parameter's grad undefined.
  absl::Status ClearGradViews();

  // Gives every parameter its own full-shape storage (tag kParam, dtype()) holding the
  // current values of the full buffer. Gradients: if the full gradient buffer is
  // allocated, each trainable parameter's grad becomes its own copy (tag kGrad, dtype())
  // of its view; otherwise every grad is dropped (undefined). Frozen parameters end with
  // no grad. Then frees every buffer and stops managing the parameters (records stay
  // readable). FailedPrecondition, changing nothing, unless the full buffer is
  // allocated, filled and in dtype().
  absl::Status Unflatten();

 private:
  // The deferred path of Flatten: allocates the shard and fills it from the recipes.
  // `context` starts its errors (core::Annotate).
  absl::Status MaterializeShard(const std::string& context);
  // The materialized path of Flatten: allocates the full buffer and copies every
  // parameter into it (padding zeroed), allocates the shard and copies the local chunk
  // into it, then points every parameter at its full-shape view and drops its grad.
  // `context` starts its errors (core::Annotate).
  absl::Status CopyInParameters(const std::string& context);
  // A zeroed-or-not 1-D buffer of shard_numel() elements of dtype() on shard_device(),
  // from the pinned host allocator under NOTE [Shard on the host].
  absl::StatusOr<core::Tensor> AllocateShardBuffer(core::MemoryTag tag) const;
  FlatParameter() = default;

  // FailedPrecondition once unflattened.
  absl::Status CheckManaged(absl::string_view op) const;
  // "FlatParameter <label>" for core::Annotate.
  std::string Context() const;
  // Context() + ": " for messages.
  std::string Prefix() const;
  // Views of `buffer` for every record: full-shape (`full_shape`) at the record's offset,
  // or 1-D at the local shard slice; `skip_frozen` leaves frozen ones undefined.
  absl::StatusOr<std::vector<core::Tensor>> MakeViews(const core::Tensor& buffer, bool full_shape,
                                                      bool skip_frozen) const;
  // FailedPrecondition naming the first managed parameter whose data (or grad) shares
  // `buffer`'s storage.
  absl::Status CheckNotViewed(const core::Tensor& buffer, bool grads, absl::string_view what,
                              absl::string_view remedy) const;
  absl::Status CheckFloatDType(core::DType dtype, absl::string_view op) const;

  std::string label_;
  int world_size_ = 1;
  int rank_ = 0;
  core::DType dtype_ = core::DType::kFloat32;
  core::Device device_ = core::Device::Cpu();
  bool shard_on_host_ = false;
  int64_t numel_ = 0;
  int64_t padded_numel_ = 0;
  int64_t shard_numel_ = 0;
  std::vector<ParamRecord> records_;
  std::vector<core::ParameterPtr> params_;

  core::Tensor full_;
  bool full_filled_ = false;
  core::Tensor shard_;
  core::Tensor full_grad_;
  bool full_grad_is_shard_grad_ = false;
  core::Tensor shard_grad_;
  int64_t bytes_copied_ = 0;
  bool unflattened_ = false;
};

}  // namespace flatten

#endif  // FLATTEN_FLAT_PARAMETER_H_
