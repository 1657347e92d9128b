#include "squared_relu.h"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace consumer {
namespace {

using core::Tensor;

// The op's one check: a defined fp32 CPU tensor. The device comes first, so a tensor that
// stands for one on a GPU (even a meta one, with no storage) is named by its device.
absl::Status CheckInput(const Tensor& x) {
  if (!x.device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SquaredRelu: input x must be on the CPU, got ", x.ToString()));
  }
  if (x.dtype() != core::DType::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat("SquaredRelu: input x must be float32, got ", x.ToString()));
  }
  if (!x.defined()) {
    return absl::InvalidArgumentError(
        x.is_meta() ? absl::StrCat("SquaredRelu: input x has no storage (", x.ToString(), ")")
                    : std::string("SquaredRelu: input x is undefined"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Tensor> SquaredRelu(core::Arg x_arg) {
  RETURN_IF_ERROR(x_arg.status());
  const Tensor& x = x_arg.tensor();
  RETURN_IF_ERROR(CheckInput(x));
  // Sized like x, which exists: only an allocation failure can stop it.
  ASSIGN_OR_RETURN(Tensor y, Tensor::Allocate(x.shape()));
  const float* in = x.data<float>();
  float* out = y.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float r = in[i] > 0.0f ? in[i] : 0.0f;
    out[i] = r * r;
  }
  // The backward needs x (saved, so an in-place write to it before Backward is caught).
  RETURN_IF_ERROR(core::RecordFunction(
      "SquaredRelu", {x}, {&y}, {x},
      [](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        const Tensor& g = ctx.grad(0);  // fp32, x's shape, on the CPU
        const Tensor& saved_x = ctx.saved(0);
        ASSIGN_OR_RETURN(Tensor gx, Tensor::Allocate(g.shape()));
        const float* gp = g.data<float>();
        const float* xp = saved_x.data<float>();
        float* gxp = gx.data<float>();
        for (int64_t i = 0; i < g.numel(); ++i) {
          gxp[i] = xp[i] > 0.0f ? gp[i] * 2.0f * xp[i] : 0.0f;
        }
        return std::vector<Tensor>{gx};
      },
      {"x"}));
  return y;
}

}  // namespace consumer
