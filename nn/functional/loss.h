// Losses as differentiable ops: CrossEntropy and Mse (torch.nn.functional.cross_entropy
// and mse_loss, reduction 'mean'). Each returns its loss as a one-element fp32 tensor
// (shape []) on the inputs' device, ready for core::Backward.
//
//   namespace F = nn::functional;
//   absl::StatusOr<core::Tensor> loss = F::CrossEntropy(logits, targets);  // [B, T, V], [B, T]
//   RETURN_IF_ERROR(loss.status());
//   RETURN_IF_ERROR(core::Backward(*loss));
//
// NOTE [Functional losses]: both reuse nn/losses' computation, which makes the gradient in
// the same pass as the loss: the forward keeps that gradient (dloss/dinput for a seed of 1)
// and the backward scales it by the incoming gradient (kernels::ScaleTerm, the seed read on
// the device), or, for the seed 1 of core::Backward(loss) (core::IsUnitSeed), hands it on as it
// is. With a seed of 1 the gradients are, bit for bit, nn::CrossEntropyLoss's and
// nn::MseLoss's. CrossEntropy keeps the logits' gradient bf16 when their producer takes it so
// (a head with a bf16 weight, NOTE [bf16 logits] in nn/gpt.h: nn::CrossEntropyLoss's
// grad_dtype bf16). The loss is read on the host (one synchronisation on CUDA, as
// nn::CrossEntropyLoss without a deferred read) and written back to the device, unless
// CrossEntropyOptions::read_loss defers it.
#ifndef NN_FUNCTIONAL_LOSS_H_
#define NN_FUNCTIONAL_LOSS_H_

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "core/autograd.h"
#include "core/tensor.h"

namespace nn {
namespace functional {

// The mean over positions i with targets[i] != ignore_index of -log softmax(logits[i])
// [targets[i]] (NOTE [Functional losses]): logits [..., V] fp32 or bf16 (bf16 widened
// exactly), targets int32 of logits' leading shape on the CPU or the logits' device. When
// no target is ignored this is nn::CrossEntropyForwardBackward over all rows, the bits of
// nn::CrossEntropyLoss; otherwise the same over the kept rows only (gathered by the
// embedding lookup), their gradient scattered back and the ignored rows' gradient 0. When
// every target is ignored (or there are none) the loss is 0 and so is the gradient.
// Gradient: logits' only. InvalidArgument "CrossEntropy: ..." for a wrong dtype, shape or
// device, and for a target outside [0, V) that is not ignore_index (naming it, its flat
// position and the targets' shape).
absl::StatusOr<core::Tensor> CrossEntropy(core::Arg logits, core::Arg targets,
                                          int64_t ignore_index = -100);

struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  // NOTE [Deferred loss] (nn/losses.h): when set, the loss's value is not read here, so the step
  // has no host synchronisation: the returned tensor holds NaN (it is the graph's root for
  // core::Backward) and *read_loss is set to what reads the value (as a double holding the float
  // the undeferred tensor holds; on a device, one copy back) when called.
  std::function<absl::StatusOr<double>()>* read_loss = nullptr;
};

// CrossEntropy as above, with the options.
absl::StatusOr<core::Tensor> CrossEntropy(core::Arg logits, core::Arg targets,
                                          const CrossEntropyOptions& options);

// mean((a - b)^2) over all elements (NOTE [Functional losses]: nn::MseLoss's loss and
// gradient, computed on the host in double), a and b fp32 of one non-empty shape on one
// device. Gradients 2 (a - b) / numel for a and its negation for b. InvalidArgument
// "Mse: ..." otherwise.
absl::StatusOr<core::Tensor> Mse(core::Arg a, core::Arg b);

}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_LOSS_H_
