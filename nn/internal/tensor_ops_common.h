// The helpers that the tensor ops' files (nn/tensor_ops*.cc) share across op families: the
// optional bf16 copy of a result (the norms' and the causal softmax's) and, under
// --config=cuda, the column sums that AccumulateColumnSums and the norms' backward launch.
// Private to //nn:tensor_ops.
#ifndef NN_INTERNAL_TENSOR_OPS_COMMON_H_
#define NN_INTERNAL_TENSOR_OPS_COMMON_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/tensor.h"

namespace nn {
namespace internal {

// The optional bf16 copy of an op's fp32 result: undefined, or bf16 of `like`'s numel on
// its device (`like_name` names it in an error). Its bits, or null.
// Defined in nn/tensor_ops_norm.cc.
absl::StatusOr<uint16_t*> Bf16Out(absl::string_view what, const char* name, const core::Tensor& out,
                                  const char* like_name, const core::Tensor& like);

#ifdef FSDP_WITH_CUDA
// The fp32 scratch of `chunks` partial sums of `n` values each that a split reduction
// writes, on `device`; undefined for one chunk (the kernel adds into the result directly).
// kActivation, released by the caller after the launch: the caching allocator orders its
// reuse on the compute stream.
// Defined in nn/tensor_ops_reduce.cc, as is the next.
absl::StatusOr<core::Tensor> PartialSums(const core::Device& device, int64_t chunks, int64_t n);

// kc::ColumnSums of checked CUDA tensors on the current device, with the partial sums'
// scratch. `op` names the launch in an error.
absl::Status ColumnSumsOnCuda(absl::string_view what, absl::string_view op, const core::Tensor& x,
                              const core::Tensor& y, const core::Tensor& acc, int64_t rows,
                              int64_t cols);
#endif

}  // namespace internal
}  // namespace nn

#endif  // NN_INTERNAL_TENSOR_OPS_COMMON_H_
