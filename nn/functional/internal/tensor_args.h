// Private to nn/functional's general tensor ops (elementwise, shape, reduce): their
// argument checks and the strided-iteration structs they launch kernels with
// (NOTE [Strided iteration] in kernels/tensor.h).
//
//   ASSIGN_OR_RETURN(const core::Tensor x, internal::Input("Transpose", "input", x_arg));
//   ASSIGN_OR_RETURN(const int d, internal::NormalizeDim("Transpose", "dim0", x, dim0));
#ifndef NN_FUNCTIONAL_INTERNAL_TENSOR_ARGS_H_
#define NN_FUNCTIONAL_INTERNAL_TENSOR_ARGS_H_

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/autograd.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "kernels/tensor.h"

namespace nn {
namespace functional {
namespace internal {

// The tensor of `arg`: its error unchanged, InvalidArgument "<op>: <name> is undefined",
// or InvalidArgument when its rank is above kernels::kMaxTensorRank.
inline absl::StatusOr<core::Tensor> Input(absl::string_view op, absl::string_view name,
                                          const core::Arg& arg) {
  RETURN_IF_ERROR(arg.status());
  const core::Tensor& t = arg.tensor();
  if (!t.defined())
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is undefined"));
  if (t.dim() > kernels::kMaxTensorRank) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", name, " ", t.ToString(), " has more than ", kernels::kMaxTensorRank, " dims"));
  }
  return t;
}

// InvalidArgument "<op>: <name> must be float32, got ..." unless t is fp32.
inline absl::Status CheckFloat(absl::string_view op, absl::string_view name,
                               const core::Tensor& t) {
  if (t.dtype() == core::DType::kFloat32) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", name, " must be float32, got ", t.ToString()));
}

// InvalidArgument unless `b` is on `a`'s device.
inline absl::Status CheckSameDevice(absl::string_view op, absl::string_view a_name,
                                    const core::Tensor& a, absl::string_view b_name,
                                    const core::Tensor& b) {
  if (a.device() == b.device()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", b_name, " ", b.ToString(), " and ",
                                                 a_name, " ", a.ToString(),
                                                 " are on different devices"));
}

// `dim` of a rank-`rank` tensor (negative counts from the end) in [0, rank), or
// InvalidArgument naming `name` and the tensor.
inline absl::StatusOr<int> NormalizeDim(absl::string_view op, absl::string_view name,
                                        const core::Tensor& t, int64_t dim, int64_t rank) {
  if (dim < -rank || dim >= rank) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " ", dim,
                                                   " is out of range for ", t.ToString(),
                                                   " (valid: [", -rank, ", ", rank, "))"));
  }
  return static_cast<int>(dim < 0 ? dim + rank : dim);
}
inline absl::StatusOr<int> NormalizeDim(absl::string_view op, absl::string_view name,
                                        const core::Tensor& t, int64_t dim) {
  return NormalizeDim(op, name, t, dim, t.dim());
}

// Row-major strides of a contiguous tensor of `shape`, in elements.
inline core::Shape ContiguousStrides(const core::Shape& shape) {
  core::Shape strides(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * shape[d + 1];
  }
  return strides;
}

// An iteration over `sizes` with operand t's strides strides[t] (each of sizes' length,
// at most kMaxTensorRank, as Input checked).
template <int N>
kernels::StridedIter<N> MakeIter(const core::Shape& sizes, const core::Shape (&strides)[N]) {
  kernels::StridedIter<N> it;
  it.rank = static_cast<int>(sizes.size());
  for (int d = 0; d < it.rank; ++d) {
    it.sizes[d] = sizes[d];
    for (int t = 0; t < N; ++t) it.strides[t][d] = strides[t][d];
  }
  return it;
}

// A fresh fp32 (or `dtype`) activation of `shape` on `device`.
inline absl::StatusOr<core::Tensor> NewTensor(const core::Shape& shape, const core::Device& device,
                                              core::DType dtype = core::DType::kFloat32) {
  return core::Tensor::Allocate(shape, dtype, core::MemoryTag::kActivation, device);
}

// NewTensor filled with zeros (asynchronously on CUDA).
inline absl::StatusOr<core::Tensor> NewZeros(const core::Shape& shape, const core::Device& device) {
  ASSIGN_OR_RETURN(core::Tensor t, NewTensor(shape, device));
  RETURN_IF_ERROR(t.TryZero());
  return t;
}

// Records `op` on y, made from x alone, with the gradient gx = grad(g) of y's gradient g:
// for ops whose backward is another op of g (Reshape, Permute, Sum, BroadcastTo, ...).
inline absl::Status RecordGradFn(
    const char* op, const core::Tensor& x, core::Tensor* y,
    std::function<absl::StatusOr<core::Tensor>(const core::Tensor& g)> grad) {
  return core::RecordFunction(op, {x}, {y}, {},
                              [grad = std::move(grad)](const core::BackwardContext& ctx)
                                  -> absl::StatusOr<std::vector<core::Tensor>> {
                                ASSIGN_OR_RETURN(core::Tensor gx, grad(ctx.grad(0)));
                                return std::vector<core::Tensor>{gx};
                              });
}

// True when `t`'s producing node takes its gradient in bf16 (Node::takes_bf16_grad): a backward
// may hand it the bf16 gradient its GEMM stores (NOTE [Functional fusions] in
// nn/functional/fused.h).
inline bool ProducerTakesBf16Grad(const core::Tensor& t) {
  const std::shared_ptr<core::AutogradMeta>& meta = t.autograd_meta();
  return meta != nullptr && !meta->leaf && meta->node != nullptr &&
         meta->node->takes_bf16_grad(meta->output_nr);
}

// The options of a record whose backward takes output 0's gradient in bf16 when `bf16` (its
// bf16 GEMMs round it so anyway), else none.
inline core::FunctionOptions Bf16GradOutput(bool bf16) {
  core::FunctionOptions options;
  if (bf16) options.bf16_grad_outputs = {0};
  return options;
}

}  // namespace internal
}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_INTERNAL_TENSOR_ARGS_H_
