// Elementwise activations without parameters: GELU (tanh form, as
// torch.nn.GELU(approximate='tanh') and GPT-2) and ReLU. Both accept fp32 of any shape on
// any device (the output and gradients stay there).
//
//   auto gelu = std::make_shared<nn::GELU>();
//   ASSIGN_OR_RETURN(core::Tensor y, gelu->Forward(x));   // same shape as x
//   ASSIGN_OR_RETURN(core::Tensor gx, gelu->Backward(gy));
#ifndef NN_ACTIVATIONS_H_
#define NN_ACTIVATIONS_H_

#include <string>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/tensor.h"

namespace nn {

// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
class GELU : public core::Module {
 public:
  GELU() = default;
  std::string TypeName() const override { return "GELU"; }

 protected:
  absl::StatusOr<core::Tensor> ForwardImpl(const core::Tensor& x) override;
  absl::StatusOr<core::Tensor> BackwardImpl(const core::Tensor& grad_output) override;
  void ReleaseActivations() override { input_ = core::Tensor(); }

 private:
  core::Tensor input_;  // cached by Forward, released by Backward
};

// y = max(x, 0); the gradient is grad_output where x > 0 and 0 elsewhere (PyTorch's
// convention at x == 0).
class ReLU : public core::Module {
 public:
  ReLU() = default;
  std::string TypeName() const override { return "ReLU"; }

 protected:
  absl::StatusOr<core::Tensor> ForwardImpl(const core::Tensor& x) override;
  absl::StatusOr<core::Tensor> BackwardImpl(const core::Tensor& grad_output) override;
  void ReleaseActivations() override { output_ = core::Tensor(); }

 private:
  core::Tensor output_;  // cached by Forward, released by Backward
};

}  // namespace nn

#endif  // NN_ACTIVATIONS_H_
