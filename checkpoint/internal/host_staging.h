// Moving checkpoint bytes between device tensors and files through page-locked
// ("pinned") host buffers. Checkpoint files do not record the device: a checkpoint or
// safetensors file written from CUDA tensors is byte-identical to one written from CPU
// tensors, and either loads into either.
//
//   ASSIGN_OR_RETURN(checkpoint::internal::HostBytes bytes,
//                    checkpoint::internal::HostBytes::Of(tensor, core::DType::kFloat32, what));
//   RETURN_IF_ERROR(writer.Append(bytes.data(), bytes.nbytes()));
//   ...
//   RETURN_IF_ERROR(checkpoint::internal::CopyHostToTensor(destination, cpu_values, what));
//
// CPU tensors never touch CUDA (the CPU build has none); CUDA tensors are copied with
// cudaMemcpy into or out of a core::PinnedBuffer (counted on core::Allocator::PinnedHost()
// under kStagingTag), which also synchronises with the compute stream, so values queued by
// earlier kernels are what is written. Dtype conversion is Tensor::CopyFrom's.
#ifndef CHECKPOINT_INTERNAL_HOST_STAGING_H_
#define CHECKPOINT_INTERNAL_HOST_STAGING_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace checkpoint {
namespace internal {

// The tag staging buffers are counted under.
inline constexpr core::MemoryTag kStagingTag = core::MemoryTag::kOther;

// A 1-D CPU tensor of `numel` elements of `dtype` over a fresh core::PinnedBuffer
// (page-locked in a CUDA build with a usable device), counted under kStagingTag; the
// tensor keeps the memory alive. Errors name `what`.
absl::StatusOr<core::Tensor> PinnedStaging(int64_t numel, core::DType dtype,
                                           const std::string& what);

// A tensor's elements as host bytes of `dtype`: a CPU tensor of that dtype in place,
// another CPU tensor converted into a CPU copy, a CUDA tensor copied into a pinned
// buffer (and converted there when the dtype differs). Keeps what it points at alive.
class HostBytes {
 public:
  static absl::StatusOr<HostBytes> Of(const core::Tensor& t, core::DType dtype,
                                      const std::string& what);
  const void* data() const { return cpu_.raw_data(); }
  int64_t nbytes() const { return nbytes_; }

 private:
  core::Tensor cpu_;  // `t` itself, a converted copy, or a tensor over pinned memory
  int64_t nbytes_ = 0;
};

// Copies the CPU tensor `src` into `dst` (same numel), converting fp32 <-> bf16: a CPU
// `dst` directly, a CUDA `dst` through a pinned buffer. The error names `what`.
absl::Status CopyHostToTensor(const core::Tensor& dst, const core::Tensor& src,
                              const std::string& what);

}  // namespace internal
}  // namespace checkpoint

#endif  // CHECKPOINT_INTERNAL_HOST_STAGING_H_
