// LayerNorm over the last dimension, as torch.nn.LayerNorm(dim, eps) with an affine
// weight and bias: y = (x - mean) / sqrt(var + eps) * weight + bias, where var is the
// biased (divide by dim) variance.
//
//   auto ln = std::make_shared<nn::LayerNorm>(768);       // weight 1, bias 0, eps 1e-5
//   ASSIGN_OR_RETURN(core::Tensor y, ln->Forward(x));    // x [..., 768] -> same shape
#ifndef NN_LAYER_NORM_H_
#define NN_LAYER_NORM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/parameter.h"
#include "core/tensor.h"

namespace nn {

class LayerNorm : public core::Module {
 public:
  // Parameters "weight" [dim] (ones) and "bias" [dim] (zeros). A non-positive `dim` or a
  // negative or non-finite `eps` makes every Forward return InvalidArgument naming it.
  explicit LayerNorm(int64_t dim, float eps = 1e-5f);

  std::string TypeName() const override { return "LayerNorm"; }

  const core::ParameterPtr& weight() const { return weight_; }
  const core::ParameterPtr& bias() const { return bias_; }
  int64_t dim() const { return dim_; }
  float eps() const { return eps_; }

  // The layer's fused steps, run without hooks: the reference for nn/functional's
  // F::AddLayerNorm, F::ResidualLayerNorm and F::LayerNormForGemm (fused_test), which a
  // block's forward runs (NOTE [Block forwards] in nn/transformer.h). ForwardAdd(a, b, &sum) sets
  // `sum` to a + b (a new activation; a and b of one shape and device, else InvalidArgument) and
  // returns what Forward(sum) returns, with its checks and cache. BackwardAdd(g, residual) returns
  // residual + Backward(g) (residual fp32 of g's shape on its device), adding the same parameter
  // gradients; given `sum16`, it also sets it to that sum rounded to bf16 (a new activation,
  // written in the same pass) for a consumer whose bf16 GEMM would round it so. With for_gemm, the
  // output is stored bf16 when the weight is bf16 (its consumer is a bf16 GEMM that would round it
  // anyway: NOTE [GEMM epilogues] in nn/tensor_ops.h); ForwardForGemm(x) is Forward(x) so.
  absl::StatusOr<core::Tensor> ForwardAdd(const core::Tensor& a, const core::Tensor& b,
                                          core::Tensor* sum, bool for_gemm = false);
  absl::StatusOr<core::Tensor> ForwardForGemm(const core::Tensor& x);
  absl::StatusOr<core::Tensor> BackwardAdd(const core::Tensor& grad_output,
                                           const core::Tensor& residual,
                                           core::Tensor* sum16 = nullptr);

 protected:
  // x: fp32 [..., dim] on the parameters' device (fp32 or bf16) -> same shape there.
  absl::StatusOr<core::Tensor> ForwardImpl(const core::Tensor& x) override;
  // Returns dL/dx and adds dL/dweight, dL/dbias into the parameters' grads.
  absl::StatusOr<core::Tensor> BackwardImpl(const core::Tensor& grad_output) override;
  void ReleaseActivations() override {
    input_ = core::Tensor();
    mean_ = core::Tensor();
    rstd_ = core::Tensor();
  }

 private:
  // Forward's checks of x and the parameters.
  absl::Status CheckForward(const core::Tensor& x) const;
  // Forward, its output bf16 when `for_gemm` and the weight is bf16.
  absl::StatusOr<core::Tensor> RunForward(const core::Tensor& x, bool for_gemm);
  // The output's dtype for `for_gemm`.
  core::DType OutputDType(bool for_gemm) const;
  // Backward (residual undefined) or BackwardAdd.
  absl::StatusOr<core::Tensor> RunBackward(const core::Tensor& grad_output,
                                           const core::Tensor& residual,
                                           core::Tensor* sum16 = nullptr);

  int64_t dim_ = 0;
  float eps_ = 0.0f;
  std::string config_error_;
  core::ParameterPtr weight_;
  core::ParameterPtr bias_;
  // Cached by Forward, released by Backward: the input (the sum of ForwardAdd), and the mean
  // and 1/std per row; the backward makes the normalised input from them again
  // (kernels::LayerNormHat, the forward's bits), so nothing input-sized is written for it.
  core::Tensor input_;
  core::Tensor mean_;  // [rows], fp32, on the input's device
  core::Tensor rstd_;  // [rows], fp32, on the input's device
};

}  // namespace nn

#endif  // NN_LAYER_NORM_H_
