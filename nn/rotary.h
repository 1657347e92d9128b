// Rotary position embedding tables, Hugging Face's LlamaRotaryEmbedding (rope type
// "default"): position t turns pair i of a head of width D (elements i and i + D / 2, the
// rotate_half convention) by the angle t * inv_freq[i], inv_freq[i] = theta^(-2i / D).
// GroupedQueryAttention applies them to q and k (nn::RotaryPackQkv, nn/tensor_ops.h).
//
//   ASSIGN_OR_RETURN(nn::RotaryTables tables,
//                    nn::MakeRotaryTables(/*positions=*/T, /*head_dim=*/64, 10000.0, device));
//   // tables.cos[t, i] = cos(t * inv_freq[i]), tables.sin likewise: fp32 [T, 32] on `device`.
#ifndef NN_ROTARY_H_
#define NN_ROTARY_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/tensor.h"

namespace nn {

struct RotaryTables {
  core::Tensor cos;  // fp32 [positions, head_dim / 2]
  core::Tensor sin;
  int64_t head_dim = 0;
  double theta = 0.0;

  // Rows of the tables (0 when empty).
  int64_t positions() const { return cos.defined() ? cos.size(0) : 0; }
};

// The tables of positions 0 .. positions - 1, each angle, cosine and sine computed in
// double and rounded once to fp32 (transformers computes them in fp32, which puts angles
// up to T off by ~T * 6e-8). Tensors tagged kOther (they are a cache of the layer, not
// activations), on `device`. InvalidArgument unless positions > 0, head_dim is positive
// and even, and theta is finite and > 0; allocation errors as Tensor::Allocate's.
absl::StatusOr<RotaryTables> MakeRotaryTables(int64_t positions, int64_t head_dim, double theta,
                                              const core::Device& device);

}  // namespace nn

#endif  // NN_ROTARY_H_
