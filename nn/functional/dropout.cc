#include "nn/functional/dropout.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/status_macros.h"
#include "kernels/cpu/dropout.h"
#include "kernels/dropout.h"
#include "nn/functional/internal/tensor_args.h"
#include "nn/internal/op_checks.h"
#include "nn/internal/op_costs.h"

#ifdef FSDP_WITH_CUDA
#include "kernels/cuda/dropout.h"
#endif

namespace nn {
namespace functional {
namespace {

using core::Tensor;
using ::nn::internal::F32;
using ::nn::internal::MutF32;

namespace kcpu = ::kernels::cpu;
#ifdef FSDP_WITH_CUDA
namespace kc = ::kernels::cuda;
#endif

// What one draw of the mask needs.
struct Mask {
  uint64_t key = 0;
  int64_t offset = 0;
  uint32_t threshold = 0;
  float scale = 1.0f;
};

// y = x * mask * scale, elementwise (y may be x); `name` the op recorded.
absl::Status RunDropout(const char* name, const Tensor& x, const Mask& m, const Tensor& y) {
  const int64_t n = x.numel();
  // About a dozen integer operations for the hash, one multiply.
  core::ProfiledOp op(core::OpCategory::kElementwise, name, x.device(),
                      ::nn::internal::ElementwiseCost(n, 2, 12));
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), "Dropout", "dropout",
               kc::Dropout(F32(x), MutF32(y), n, m.key, m.offset, m.threshold, m.scale));
  }
  kcpu::Dropout(F32(x), MutF32(y), n, m.key, m.offset, m.threshold, m.scale);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Tensor> Dropout(core::Arg x_arg, double p, uint64_t seed, uint64_t step,
                               bool training, int64_t offset) {
  RETURN_IF_ERROR(x_arg.status());
  const Tensor& x = x_arg.tensor();
  if (!x.defined()) return absl::InvalidArgumentError("Dropout: input is undefined");
  RETURN_IF_ERROR(internal::CheckFloat("Dropout", "input", x));
  if (!(p >= 0.0 && p < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Dropout: p must be in [0, 1), got ", p, " for input ", x.ToString()));
  }
  if (offset < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Dropout: offset must be >= 0, got ", offset, " for input ", x.ToString()));
  }
  if (p == 0.0 || !training) return x;
  Mask m;
  m.key = kernels::DropoutKey(seed, step);
  m.offset = offset;
  m.threshold = kernels::DropoutThreshold(p);
  m.scale = static_cast<float>(1.0 / (1.0 - p));
  ASSIGN_OR_RETURN(Tensor y, internal::NewTensor(x.shape(), x.device()));
  RETURN_IF_ERROR(RunDropout("dropout.forward", x, m, y));
  RETURN_IF_ERROR(core::RecordFunction(
      "Dropout", {x}, {&y}, {},
      [m](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        const Tensor& g = ctx.grad(0);
        ASSIGN_OR_RETURN(Tensor gx, internal::NewTensor(g.shape(), g.device()));
        RETURN_IF_ERROR(RunDropout("dropout.backward", g, m, gx));
        return std::vector<Tensor>{gx};
      }));
  return y;
}

}  // namespace functional
}  // namespace nn
