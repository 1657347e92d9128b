// Losses with their gradients, as PyTorch's reduction='mean' definitions.
//
//   ASSIGN_OR_RETURN(nn::LossResult r, nn::CrossEntropyLoss(logits, targets));
//   LOG(INFO) << "loss " << r.loss;
//   ASSIGN_OR_RETURN(core::Tensor unused, model->Backward(r.grad));   // r.grad: dloss/dlogits
#ifndef NN_LOSSES_H_
#define NN_LOSSES_H_

#include <functional>

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace nn {

// NOTE [Deferred loss]: a training step on a GPU needs the loss's value only when it is
// reported, so CrossEntropyLoss(..., defer_read = true) leaves it on the device: `loss` is
// NaN and `read_loss` returns it (the value the undeferred call gives, bit for bit) with
// the one host synchronisation, whenever the caller reads it (integration::StageRunner:
// at log steps). On the CPU the value is known at once and read_loss just returns it.
// nn::functional::CrossEntropy does the same on the autograd graph
// (CrossEntropyOptions::read_loss; the trainers' DecoderTrainModule uses it).
struct LossResult {
  float loss = 0.0f;
  std::function<absl::StatusOr<double>()> read_loss;  // set by a deferred read only
  // d loss / d input, the shape of the loss's first argument (fp32 unless asked for bf16,
  // tag kActivation).
  core::Tensor grad;
};

// mean((pred - target)^2) over all elements (torch.nn.functional.mse_loss); grad is
// 2 (pred - target) / numel. InvalidArgument unless both are non-empty fp32 tensors of the
// same shape on one device. Computed on the host (device tensors are copied there and the
// gradient back to their device).
absl::StatusOr<LossResult> MseLoss(const core::Tensor& pred, const core::Tensor& target);

// mean over tokens of -log softmax(logits)[target] (torch.nn.functional.cross_entropy
// on logits.view(-1, V)), computed with the max-subtracted log-sum-exp in double; grad
// is (softmax(logits) - onehot(target)) / num_tokens. logits: fp32 or bf16 [..., V] (bf16
// widened exactly: the results of their fp32 values, bit for bit); targets:
// int32 with logits' leading shape, each in [0, V). InvalidArgument naming the shapes or
// the first bad target otherwise, or when there are no tokens. On CUDA (logits on a
// device; targets there or on the CPU) the rows run on the device with fp32 exponentials
// and double sums; the loss comes back to the host (one synchronisation) and grad stays
// on the logits' device.
//
// grad_dtype kBFloat16 writes the gradient as bf16, each value the fp32 gradient rounded
// once: what a bf16 Linear head rounds it to anyway (NOTE [bf16 GEMMs] in nn/linear.h;
// Gpt::logits_grad_dtype says which the model wants), and no fp32 [..., V] gradient is
// ever allocated. InvalidArgument for another dtype.
//
// defer_read: NOTE [Deferred loss] above.
absl::StatusOr<LossResult> CrossEntropyLoss(const core::Tensor& logits, const core::Tensor& targets,
                                            core::DType grad_dtype = core::DType::kFloat32,
                                            bool defer_read = false);

}  // namespace nn

#endif  // NN_LOSSES_H_
