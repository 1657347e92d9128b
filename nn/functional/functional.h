// Every differentiable op of nn/functional, through one header (torch.nn.functional). Each
// op is a free function taking core::Arg (a tensor, a ParameterPtr, or an earlier op's
// result, whose error it passes on) and returning absl::StatusOr; with grad mode on it
// records its node on the autograd graph (NOTE [Autograd] in core/autograd.h).
//
//   namespace F = nn::functional;
//   absl::StatusOr<core::Tensor> h = F::Gelu(F::Linear(F::LayerNorm(x, ln_w, ln_b), fc_w, fc_b));
//   absl::StatusOr<core::Tensor> y = F::Add(x, F::Linear(h, proj_w, proj_b));
//   absl::StatusOr<core::Tensor> loss = F::CrossEntropy(F::Linear(y, head_w), targets);
//   RETURN_IF_ERROR(loss.status());               // the first failure, naming its op
//   RETURN_IF_ERROR(core::Backward(*loss));       // gradients in every Parameter::grad
//
// The families: elementwise.h (arithmetic with broadcasting, activations), shape.h
// (reshape, transpose, slice, cat, split, gathers and scatters), reduce.h (sum, mean, max),
// linear.h (MatMul, Linear), norm.h (LayerNorm, RmsNorm), softmax.h, embedding.h, loss.h
// (CrossEntropy with ignore_index, Mse), attention.h (ScaledDotProductAttention), rotary.h
// (Rotary), dropout.h, fused.h (the GPT-2 block's fused steps, with its bits), llama_fused.h
// (the Llama decoder layer's, with its bits). gradcheck.h checks any op's derivative.
#ifndef NN_FUNCTIONAL_FUNCTIONAL_H_
#define NN_FUNCTIONAL_FUNCTIONAL_H_

#include "nn/functional/attention.h"
#include "nn/functional/dropout.h"
#include "nn/functional/elementwise.h"
#include "nn/functional/embedding.h"
#include "nn/functional/fused.h"
#include "nn/functional/linear.h"
#include "nn/functional/llama_fused.h"
#include "nn/functional/loss.h"
#include "nn/functional/norm.h"
#include "nn/functional/reduce.h"
#include "nn/functional/rotary.h"
#include "nn/functional/shape.h"
#include "nn/functional/softmax.h"

#endif  // NN_FUNCTIONAL_FUNCTIONAL_H_
