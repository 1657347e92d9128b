#include "nn/swiglu.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/functional/llama_fused.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"

namespace nn {

namespace F = ::nn::functional;

SwiGluMlp::SwiGluMlp(int64_t hidden, int64_t intermediate, uint64_t seed) {
  config_error_ = internal::FirstError({internal::PositiveOrMessage("hidden", hidden),
                                        internal::PositiveOrMessage("intermediate", intermediate)});
  const int64_t c = std::max<int64_t>(hidden, 1), i = std::max<int64_t>(intermediate, 1);
  gate_proj_ =
      RegisterModule("gate_proj", std::make_shared<Linear>(c, i, false, DeriveSeed(seed, 0)));
  up_proj_ = RegisterModule("up_proj", std::make_shared<Linear>(c, i, false, DeriveSeed(seed, 1)));
  down_proj_ =
      RegisterModule("down_proj", std::make_shared<Linear>(i, c, false, DeriveSeed(seed, 2)));
}

absl::StatusOr<core::Tensor> SwiGluMlp::Hidden(const core::Tensor& x, bool h_for_gemm) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  const core::DType gate_dtype = gate_proj_->weight()->data.dtype();
  if (internal::RunsInline(*gate_proj_) && internal::RunsInline(*up_proj_) &&
      up_proj_->weight()->data.dtype() == gate_dtype) {
    F::SwiGluOptions options;
    options.h_for_gemm = h_for_gemm;
    return internal::InModule(*this,
                              F::SwiGlu(x, gate_proj_->weight(), up_proj_->weight(), options));
  }
  // NOTE [GEMM epilogues]: h stored bf16 for a bf16 down_proj GEMM that takes it.
  const bool h16 = h_for_gemm && down_proj_->weight()->data.dtype() == core::DType::kBFloat16;
  return internal::InModule(*this,
                            F::SiluMul(ApplyLinear(*gate_proj_, x), ApplyLinear(*up_proj_, x),
                                       h16 ? core::DType::kBFloat16 : core::DType::kFloat32));
}

absl::StatusOr<core::Tensors> SwiGluMlp::ForwardGraph(const core::Tensors& in) {
  RETURN_IF_ERROR(internal::CheckInputCount(*this, in, 1));
  RETURN_IF_ERROR(internal::CheckMaterialized(*this));
  // NOTE [GEMM epilogues]: h stored bf16 for down_proj's bf16 GEMM when it runs inline.
  ASSIGN_OR_RETURN(core::Tensor y,
                   ApplyLinear(*down_proj_, Hidden(in[0], internal::RunsInline(*down_proj_))));
  return core::Tensors{std::move(y)};
}

}  // namespace nn
