// The rotary position embedding as a differentiable op (Hugging Face's LlamaRotaryEmbedding
// with apply_rotary_pos_emb, rope type "default"): position p turns pair i of a head of
// width D, elements i and i + D / 2 (the rotate_half convention), by the angle
// p theta^(-2i / D), with the tables of nn/rotary.h and the body of nn::RotaryPackQkv
// (kernels::RotaryRotate), on the CPU or CUDA.
//
//   namespace F = nn::functional;
//   // q [B, H, T, 64] at positions 0 .. T-1, tables made once for up to 4096 positions:
//   ASSIGN_OR_RETURN(nn::RotaryTables tables,
//                    nn::MakeRotaryTables(4096, 64, /*theta=*/10000.0, q.device()));
//   absl::StatusOr<core::Tensor> q_rot = F::Rotary(q, tables);
//   absl::StatusOr<core::Tensor> k_rot = F::Rotary(k, tables, /*offset=*/past_length);
//
// The layout is x [..., T, D]: the last dim a head, the one before it the positions, any
// dims before those (batch, heads) sharing them; [B, H, T, D] as ScaledDotProductAttention
// takes it (nn/functional/attention.h). With the same tables each element has the bits
// nn::RotaryPackQkv gives it (which reads [B, T, H, D]), its gradient those of
// nn::RotaryPackQkvBackward. The gradient is the inverse rotation of the output's.
//
// Errors: InvalidArgument "Rotary: ..." naming the argument and its shape (x undefined, not
// fp32, under 2-D or of an odd last dim; tables of another head width or device, or too
// few positions; positions of a wrong shape or dtype, or on the CPU a value outside the
// tables); an Arg's own error is returned unchanged.
#ifndef NN_FUNCTIONAL_ROTARY_H_
#define NN_FUNCTIONAL_ROTARY_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/autograd.h"
#include "core/tensor.h"
#include "nn/rotary.h"

namespace nn {
namespace functional {

// x [..., T, D] fp32 turned at positions offset .. offset + T - 1 (offset >= 0): the
// tables (nn::MakeRotaryTables, on x's device, head_dim D) must hold offset + T positions.
absl::StatusOr<core::Tensor> Rotary(core::Arg x, const RotaryTables& tables, int64_t offset = 0);

// x [..., T, D] fp32 turned at `positions`: int32 [T] (every block of T rows) or [N, T]
// with N dividing x's leading count L = x.numel() / (T D), row n serving L / N consecutive
// blocks ([B, T] for x [B, H, T, D]: each sequence its own positions), on x's device. On
// the CPU a position outside [0, tables.positions()) is InvalidArgument; on CUDA the values
// stay on the device unchecked and such a row is left as it is (NOTE [Index checks] in
// nn/functional/shape.h). Positions carry no gradient.
absl::StatusOr<core::Tensor> Rotary(core::Arg x, const RotaryTables& tables, core::Arg positions);

// x [..., T, D] turned at positions offset .. offset + T - 1 with tables of `theta` made
// for this call (nn::MakeRotaryTables of offset + T positions: O((offset + T) D) host sines
// and cosines and, on CUDA, their copy): for a loop, make the tables once and pass them.
// InvalidArgument also for theta not finite and > 0.
absl::StatusOr<core::Tensor> Rotary(core::Arg x, int64_t offset = 0, double theta = 10000.0);

}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_ROTARY_H_
