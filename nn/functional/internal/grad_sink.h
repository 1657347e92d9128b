// Private to nn/functional: where a layer op's backward puts the gradient of a weight-like
// input. A parameter leaf's gradient is added into Parameter::grad directly (the GEMM or
// column sums accumulate with beta 1, as the hand-written layers' backward does); any other
// input that needs a gradient gets a fresh zero tensor, which the backward fills the same
// way and returns to the engine.
//
//   ASSIGN_OR_RETURN(internal::GradSink gw,
//                    internal::GradSinkFor(ctx, 1, "Linear", "weight", {out, in}, device));
//   ... accumulate into gw.tensor (when defined) ...
//   return std::vector<core::Tensor>{gx, gw.returned(), gb.returned()};
#ifndef NN_FUNCTIONAL_INTERNAL_GRAD_SINK_H_
#define NN_FUNCTIONAL_INTERNAL_GRAD_SINK_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/autograd.h"
#include "core/parameter.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "nn/internal/validate.h"
#include "nn/tensor_ops.h"

namespace nn {
namespace functional {
namespace internal {

// Where input i's gradient goes: undefined `tensor` when nobody needs it; the parameter's
// grad (nn::internal::ParameterGradIn) when input i is a parameter leaf; else a fresh fp32 zero
// tensor of `shape` on `device` (the input's), which returned() hands to the engine.
struct GradSink {
  core::Tensor tensor;
  bool to_return = false;
  core::Tensor returned() const { return to_return ? tensor : core::Tensor(); }
};
inline absl::StatusOr<GradSink> GradSinkFor(const core::BackwardContext& ctx, int i,
                                            absl::string_view op, absl::string_view name,
                                            const core::Shape& shape, const core::Device& device) {
  GradSink sink;
  if (!ctx.needs_grad(i)) return sink;
  if (core::ParameterPtr p = ctx.parameter(i)) {
    ASSIGN_OR_RETURN(sink.tensor, ::nn::internal::ParameterGradIn(
                                      absl::StrCat(op, ": parameter '", name, "'"), *p));
    return sink;
  }
  ASSIGN_OR_RETURN(sink.tensor, core::Tensor::Allocate(shape, core::DType::kFloat32,
                                                       core::MemoryTag::kActivation, device));
  RETURN_IF_ERROR(ZeroTensor(absl::StrCat(op, ": ", name, " gradient"), sink.tensor));
  sink.to_return = true;
  return sink;
}

}  // namespace internal
}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_INTERNAL_GRAD_SINK_H_
