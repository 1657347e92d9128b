// RmsNorm: root-mean-square normalisation over the last dimension, as Hugging Face's
// LlamaRMSNorm (and torch.nn.RMSNorm with an affine weight): y = x / sqrt(mean(x^2) + eps)
// * weight, the mean and the reciprocal root computed in fp32 (activations are fp32 here;
// a bf16 weight is widened exactly).
//
//   auto norm = std::make_shared<nn::RmsNorm>(/*dim=*/512, /*eps=*/1e-6f);   // weight 1
//   ASSIGN_OR_RETURN(core::Tensor y, norm->Forward(x));   // x [..., 512] -> same shape
//   ASSIGN_OR_RETURN(core::Tensor gx, norm->Backward(gy));   // adds into weight()->grad
#ifndef NN_RMS_NORM_H_
#define NN_RMS_NORM_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/parameter.h"
#include "core/tensor.h"

namespace nn {

class RmsNorm : public core::Module {
 public:
  // Parameter "weight" [dim] (ones; Hugging Face has no bias). A non-positive `dim` or a
  // negative or non-finite `eps` makes every Forward return InvalidArgument naming it.
  explicit RmsNorm(int64_t dim, float eps = 1e-6f);

  std::string TypeName() const override { return "RmsNorm"; }

  const core::ParameterPtr& weight() const { return weight_; }
  int64_t dim() const { return dim_; }
  float eps() const { return eps_; }

  // The layer's fused steps, run without hooks: the reference for nn/functional's
  // F::ResidualRmsNorm and F::RmsNormForGemm (llama_fused_test), which a decoder layer's
  // forward runs (NOTE [Block forwards] in nn/transformer.h).
  // NOTE [GEMM epilogues] (nn/tensor_ops.h): ForwardForGemm is Forward(x) stored bf16 when the
  // weight is bf16 (each element the fp32 output rounded once: the operand the GEMM would round it
  // to, without the fp32 copy and the rounding pass); with an fp32 weight it is Forward(x).
  absl::StatusOr<core::Tensor> ForwardForGemm(const core::Tensor& x);
  // BackwardAdd returns residual + Backward(grad_output) (residual fp32 of grad_output's shape on
  // its device, else InvalidArgument naming this module), the same bits, in one pass (NOTE [Fused
  // ops], nn::RmsNormBackwardAdd), adding the same weight gradient; given `sum16`, it also sets it
  // to that sum rounded to bf16 (a new activation, written in the same pass) for a consumer whose
  // bf16 GEMM would round it so.
  absl::StatusOr<core::Tensor> BackwardAdd(const core::Tensor& grad_output,
                                           const core::Tensor& residual,
                                           core::Tensor* sum16 = nullptr);

 protected:
  // x: fp32 [..., dim] on the weight's device (fp32 or bf16) -> same shape there.
  absl::StatusOr<core::Tensor> ForwardImpl(const core::Tensor& x) override;
  // Returns dL/dx and adds dL/dweight = sum over rows of g * x * rstd.
  absl::StatusOr<core::Tensor> BackwardImpl(const core::Tensor& grad_output) override;
  void ReleaseActivations() override {
    input_ = core::Tensor();
    rstd_ = core::Tensor();
  }

 private:
  // Forward, its output bf16 when `for_gemm` and the weight is bf16.
  absl::StatusOr<core::Tensor> RunForward(const core::Tensor& x, bool for_gemm);
  // Backward (residual undefined) or BackwardAdd.
  absl::StatusOr<core::Tensor> RunBackward(const core::Tensor& grad_output,
                                           const core::Tensor& residual,
                                           core::Tensor* sum16 = nullptr);

  int64_t dim_ = 0;
  float eps_ = 0.0f;
  std::string config_error_;
  core::ParameterPtr weight_;
  // Cached by Forward, released by Backward: the input x (xhat = x * rstd is made again from
  // it, as LayerNorm does) and rstd per row (fp32).
  core::Tensor input_;
  core::Tensor rstd_;
};

}  // namespace nn

#endif  // NN_RMS_NORM_H_
