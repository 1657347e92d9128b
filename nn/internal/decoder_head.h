// The head of the decoders (nn::Gpt, nn::Llama): their logits from the final norm's output, by
// the head's GEMM run inline or by calling the head (NOTE [Block forwards] in nn/transformer.h).
#ifndef NN_INTERNAL_DECODER_HEAD_H_
#define NN_INTERNAL_DECODER_HEAD_H_

#include <utility>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/tensor.h"
#include "nn/functional/fused.h"
#include "nn/internal/validate.h"
#include "nn/linear.h"

namespace nn {
namespace internal {

// {logits} of `model` from `normed` (an error in it is returned, named by `model`): the head's
// GEMM inline when `head_inline`, storing them bf16 under a bf16 weight (NOTE [bf16 logits] in
// nn/gpt.h), else lm_head's Call. Sets *grad_dtype to the dtype the head's backward takes the
// logits' gradient in: bf16 for an inline head with a bf16 weight, else fp32.
inline absl::StatusOr<core::Tensors> DecoderLogits(const core::Module& model, Linear& lm_head,
                                                   bool head_inline,
                                                   absl::StatusOr<core::Tensor> normed,
                                                   core::DType* grad_dtype) {
  *grad_dtype = head_inline && lm_head.weight()->data.dtype() == core::DType::kBFloat16
                    ? core::DType::kBFloat16
                    : core::DType::kFloat32;
  absl::StatusOr<core::Tensor> logits =
      head_inline ? functional::LinearForGemm(normed, lm_head.weight()) : lm_head.CallOne({normed});
  ASSIGN_OR_RETURN(core::Tensor out, InModule(model, std::move(logits)));
  return core::Tensors{std::move(out)};
}

}  // namespace internal
}  // namespace nn

#endif  // NN_INTERNAL_DECODER_HEAD_H_
