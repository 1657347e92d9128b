#include "nn/functional/attention.h"

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/status_macros.h"
#include "kernels/attention_mask.h"
#include "kernels/cpu/attention_mask.h"
#include "nn/functional/elementwise.h"
#include "nn/functional/internal/tensor_args.h"
#include "nn/functional/internal/tensor_dispatch.h"
#include "nn/functional/linear.h"
#include "nn/functional/reduce.h"
#include "nn/functional/shape.h"
#include "nn/functional/softmax.h"
#include "nn/internal/op_checks.h"
#include "nn/internal/op_costs.h"
#include "nn/tensor_ops.h"

#ifdef FSDP_WITH_CUDA
#include "kernels/cuda/attention_mask.h"
#endif

namespace nn {
namespace functional {
namespace {

using core::DType;
using core::Shape;
using core::Tensor;
using ::nn::internal::F32;
using ::nn::internal::MutF32;

namespace kcpu = ::kernels::cpu;
#ifdef FSDP_WITH_CUDA
namespace kc = ::kernels::cuda;
#endif

constexpr const char* kOp = "ScaledDotProductAttention";

struct Dims {
  int64_t B = 0, H = 0, Hkv = 0, T = 0, S = 0, D = 0;
  int64_t group() const { return H / Hkv; }
};

absl::StatusOr<Tensor> Input(const char* name, const core::Arg& arg) {
  RETURN_IF_ERROR(arg.status());
  const Tensor& t = arg.tensor();
  if (!t.defined())
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": ", name, " is undefined"));
  RETURN_IF_ERROR(internal::CheckFloat(kOp, name, t));
  if (t.dim() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": ", name, " must be 4-D [B, ",
                                                   name[0] == 'q' ? "H, T" : "Hkv, S", ", D], got ",
                                                   t.ToString()));
  }
  return t;
}

absl::StatusOr<Dims> CheckShapes(const Tensor& q, const Tensor& k, const Tensor& v) {
  RETURN_IF_ERROR(::nn::internal::CheckDevices(kOp, {{"q", &q}, {"k", &k}, {"v", &v}}));
  if (k.shape() != v.shape()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": k ", k.ToString(), " and v ", v.ToString(), " must have one shape"));
  }
  Dims d{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3)};
  if (k.size(0) != d.B || k.size(3) != d.D) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": k and v ", k.ToString(), " must share B and D with q ", q.ToString()));
  }
  if (d.Hkv <= 0 || d.H % d.Hkv != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": the kv heads of k and v ", k.ToString(),
                                                   " must divide the heads of q ", q.ToString()));
  }
  return d;
}

// The mask as 4-D [mb, mh, mt, ms], each its size or 1, after checking that it broadcasts
// to [B, H, T, S].
absl::StatusOr<Shape> MaskShape(const Tensor& mask, const Tensor& q, const Dims& d) {
  RETURN_IF_ERROR(internal::CheckSameDevice(kOp, "q", q, "mask", mask));
  if (mask.dtype() != DType::kFloat32 && mask.dtype() != DType::kInt32) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": mask must be float32 or int32, got ", mask.ToString()));
  }
  const Shape target = {d.B, d.H, d.T, d.S};
  bool ok = mask.dim() <= 4;
  Shape padded(4, 1);
  for (int64_t i = 0; ok && i < mask.dim(); ++i) {
    const int64_t size = mask.size(-1 - i), want = target[3 - i];
    ok = size == want || size == 1;
    padded[3 - i] = size;
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": mask ", mask.ToString(), " does not broadcast to the scores [B, H, T, S] ",
        core::ShapeToString(target)));
  }
  return padded;
}

// The layout kernels::AttentionMaskValue reads a mask of 4-D shape `m` through (no mask:
// `m` all ones), for rows [m[0], m[1], T] of S columns.
kernels::AttentionMaskLayout MaskLayout(const Shape& m, const Dims& d, bool causal) {
  const Shape strides = internal::ContiguousStrides(m);
  kernels::AttentionMaskLayout layout;
  layout.heads = m[1];
  layout.T = d.T;
  layout.S = d.S;
  layout.stride_b = m[0] == 1 ? 0 : strides[0];
  layout.stride_h = m[1] == 1 ? 0 : strides[1];
  layout.stride_t = m[2] == 1 ? 0 : strides[2];
  layout.stride_s = m[3] == 1 ? 0 : strides[3];
  layout.causal = causal;
  return layout;
}

const float* FMask(const Tensor& mask) {
  return mask.defined() && mask.dtype() == DType::kFloat32 ? F32(mask) : nullptr;
}
const int32_t* IMask(const Tensor& mask) {
  return mask.defined() && mask.dtype() == DType::kInt32 ? mask.data<int32_t>() : nullptr;
}

// add [rows, S] and valid [rows] of kernels::AttentionMask on the mask's device.
absl::Status RunMask(const kernels::AttentionMaskLayout& m, const Tensor& mask, const Tensor& add,
                     const Tensor& valid, int64_t rows) {
  core::ProfiledOp op(core::OpCategory::kAttention, "attention_mask.forward", add.device(),
                      ::nn::internal::ElementwiseCost(rows * m.S, mask.defined() ? 2 : 1, 2));
  if (add.device().is_cuda()) {
    NN_ON_CUDA(add.device(), kOp, "attention mask",
               kc::AttentionMask(m, FMask(mask), IMask(mask), MutF32(add), MutF32(valid), rows));
  }
  kcpu::AttentionMask(m, FMask(mask), IMask(mask), MutF32(add), MutF32(valid), rows);
  return absl::OkStatus();
}

absl::Status RunMaskBackward(const kernels::AttentionMaskLayout& m, const Tensor& mask,
                             const Tensor& g, const Tensor& gmask, int64_t rows) {
  core::ProfiledOp op(core::OpCategory::kAttention, "attention_mask.backward", g.device(),
                      ::nn::internal::ElementwiseCost(rows * m.S, 3, 1));
  if (g.device().is_cuda()) {
    NN_ON_CUDA(g.device(), kOp, "attention mask backward",
               kc::AttentionMaskBackward(m, FMask(mask), IMask(mask), F32(g), MutF32(gmask), rows));
  }
  kcpu::AttentionMaskBackward(m, FMask(mask), IMask(mask), F32(g), MutF32(gmask), rows);
  return absl::OkStatus();
}

// The additive mask [mb, mh, T, S] and each row's "keeps a position" flag [mb, mh, T, 1]
// (1 or 0) of NOTE [Attention masks]; an fp32 mask gets the gradient of its kept entries.
struct AdditiveMask {
  Tensor add;
  Tensor valid;
};

absl::StatusOr<AdditiveMask> MakeMask(const Tensor& mask, const Shape& m, const Dims& d,
                                      bool causal, const core::Device& device) {
  const kernels::AttentionMaskLayout layout = MaskLayout(m, d, causal);
  const int64_t rows = m[0] * m[1] * d.T;
  AdditiveMask out;
  ASSIGN_OR_RETURN(out.add, internal::NewTensor({m[0], m[1], d.T, d.S}, device));
  ASSIGN_OR_RETURN(out.valid, internal::NewTensor({m[0], m[1], d.T, 1}, device));
  RETURN_IF_ERROR(RunMask(layout, mask, out.add, out.valid, rows));
  if (!mask.defined() || mask.dtype() != DType::kFloat32) return out;
  RETURN_IF_ERROR(core::RecordFunction(
      "ScaledDotProductAttention.mask", {mask}, {&out.add}, {mask},
      [layout, m, rows](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        const Tensor& mask = ctx.saved(0);
        ASSIGN_OR_RETURN(Tensor gfull,
                         internal::NewTensor(ctx.grad(0).shape(), ctx.grad(0).device()));
        RETURN_IF_ERROR(RunMaskBackward(layout, mask, ctx.grad(0), gfull, rows));
        ASSIGN_OR_RETURN(Tensor gmask, Reshape(SumToShape(gfull, m), mask.shape()));
        return std::vector<Tensor>{gmask};
      },
      {"mask"}));
  return out;
}

// NOTE [Attention paths]: the composition.
absl::StatusOr<Tensor> Composite(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& mask, const Shape& mask_shape, const Dims& d,
                                 bool causal, float scale) {
  // NOTE [Op accounting]: the score and value GEMMs count as attention.
  core::ScopedOpCategory role(core::OpCategory::kAttention);
  const int64_t rows = d.group() * d.T;  // a kv head's query rows
  ASSIGN_OR_RETURN(
      Tensor scores,
      Reshape(MatMul(Reshape(MulScalar(q, scale), {d.B, d.Hkv, rows, d.D}), Transpose(k, 2, 3)),
              {d.B, d.H, d.T, d.S}));
  AdditiveMask m;
  if (mask.defined() || causal) {
    ASSIGN_OR_RETURN(m, MakeMask(mask, mask_shape, d, causal, q.device()));
    ASSIGN_OR_RETURN(scores, Add(scores, m.add));
  }
  ASSIGN_OR_RETURN(Tensor probs, Softmax(scores));
  // Only a mask can mask a whole row: the causal cut keeps key 0 for every query.
  if (mask.defined()) {
    ASSIGN_OR_RETURN(probs, Mul(probs, m.valid));
  }
  return Reshape(MatMul(Reshape(probs, {d.B, d.Hkv, rows, d.S}), v), {d.B, d.H, d.T, d.D});
}

// The fused path's layout: [B, T, 3C] (C = H D) with q, k, v at columns 0, C, 2C and head h
// at h D of each (NOTE [Fused attention]). `part` 0, 1, 2 is q, k, v; `heads` their head
// count, each kv head repeated for the G query heads of its group. Returns the strides and
// sizes that walk `t` ([B, heads, T, D], contiguous) and the packed buffer together, and
// the packed buffer's offset.
struct PackedWalk {
  Shape sizes, t_strides, packed_strides;
  int64_t packed_offset = 0;
};

PackedWalk Walk(const Dims& d, int part) {
  const int64_t C = d.H * d.D, row = 3 * C, G = part == 0 ? 1 : d.group();
  const int64_t heads = part == 0 ? d.H : d.Hkv;
  PackedWalk w;
  w.sizes = {d.B, heads, G, d.T, d.D};
  w.t_strides = {heads * d.T * d.D, d.T * d.D, 0, d.D, 1};
  w.packed_strides = {d.T * row, G * d.D, d.D, row, 1};
  w.packed_offset = part * C;
  return w;
}

// The packed bf16 q, k, v of the fused kernel, from q, k, v (one fp32 pass each, then one
// rounding pass).
absl::StatusOr<Tensor> Pack(const Tensor& q, const Tensor& k, const Tensor& v, const Dims& d) {
  ASSIGN_OR_RETURN(Tensor packed, internal::NewTensor({d.B, d.T, 3 * d.H * d.D}, q.device()));
  const Tensor* parts[3] = {&q, &k, &v};
  for (int part = 0; part < 3; ++part) {
    const PackedWalk w = Walk(d, part);
    RETURN_IF_ERROR(internal::CopyStrided(kOp, *parts[part], 0, w.t_strides, packed,
                                          w.packed_offset, w.packed_strides, w.sizes));
  }
  return packed.ToDType(DType::kBFloat16, core::MemoryTag::kActivation);
}

// Part `part` (q, k or v) of the packed gradient gqkv [B, T, 3C] fp32 as [B, heads, T, D],
// a kv head's the sum over its group's heads (NOTE [Sum order]).
absl::StatusOr<Tensor> Unpack(const Tensor& gqkv, const Dims& d, int part) {
  const PackedWalk w = Walk(d, part);
  const int64_t G = w.sizes[2];
  ASSIGN_OR_RETURN(Tensor out, internal::NewTensor(w.sizes, gqkv.device()));
  // The group dim is walked as out's own (contiguous) dim here, not broadcast.
  RETURN_IF_ERROR(internal::CopyStrided(kOp, gqkv, w.packed_offset, w.packed_strides, out, 0,
                                        internal::ContiguousStrides(w.sizes), w.sizes));
  if (G == 1) return Reshape(out, {d.B, w.sizes[1], d.T, d.D});
  return Sum(out, {2});
}

// NOTE [Attention paths]: the fused kernel as a custom function. Is the copy into its
// layout worth it? Per the op costs (the CUDA path's bytes, nn/internal/op_costs.h), for
// B 1, H 8, T = S 1024, D 64, causal, forward and backward: the composition moves ~570 MB
// (the [B, H, T, S] scores, probabilities and their gradients through the GEMMs, the mask
// add and the softmax), the fused path ~130 MB, of which the packing, the bf16 roundings
// and the unpacking are ~46 MB (35%). The copies cost O(B H T D) against the O(B H T S)
// the kernel saves, so they pay for themselves from T about D on; at T 256 the bytes are
// still 41 MB against 22 MB. On the CPU the kernel's twin is a reference loop, not a GEMM:
// there the fused path took 5x the composition's time (1.2 s against 0.23 s for the shape
// above, -c opt), so `fused` is for CUDA.
absl::StatusOr<Tensor> Fused(const Tensor& q, const Tensor& k, const Tensor& v, const Dims& d,
                             float scale) {
  const int64_t C = d.H * d.D;
  ASSIGN_OR_RETURN(Tensor qkv, Pack(q, k, v, d));
  ASSIGN_OR_RETURN(Tensor y, internal::NewTensor({d.B, d.T, C}, q.device()));
  ASSIGN_OR_RETURN(Tensor lse, internal::NewTensor({d.B, d.H, d.T}, q.device()));
  RETURN_IF_ERROR(FusedAttentionForward(kOp, qkv, d.H, scale, y, lse));
  // y's heads [B, T, H, D] -> [B, H, T, D].
  const Shape heads = {d.B, d.H, d.T, d.D};
  const Shape y_strides = {d.T * C, d.D, C, 1};
  ASSIGN_OR_RETURN(Tensor out, internal::NewTensor(heads, q.device()));
  RETURN_IF_ERROR(internal::CopyStrided(kOp, y, 0, y_strides, out, 0,
                                        internal::ContiguousStrides(heads), heads));
  RETURN_IF_ERROR(core::RecordFunction(
      kOp, {q, k, v}, {&out}, {qkv, y, lse},
      [d, scale, heads,
       y_strides](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        const Tensor& g = ctx.grad(0);
        ASSIGN_OR_RETURN(Tensor gy, internal::NewTensor({d.B, d.T, d.H * d.D}, g.device()));
        RETURN_IF_ERROR(internal::CopyStrided(kOp, g, 0, internal::ContiguousStrides(heads), gy, 0,
                                              y_strides, heads));
        ASSIGN_OR_RETURN(Tensor gy16, gy.ToDType(DType::kBFloat16, core::MemoryTag::kActivation));
        ASSIGN_OR_RETURN(Tensor gqkv, internal::NewTensor(ctx.saved(0).shape(), g.device()));
        ASSIGN_OR_RETURN(Tensor delta, internal::NewTensor({d.B, d.H, d.T}, g.device()));
        RETURN_IF_ERROR(FusedAttentionBackward(kOp, ctx.saved(0), ctx.saved(1), gy16, ctx.saved(2),
                                               delta, d.H, scale, gqkv));
        std::vector<Tensor> grads(3);
        for (int part = 0; part < 3; ++part) {
          if (ctx.needs_grad(part)) {
            ASSIGN_OR_RETURN(grads[part], Unpack(gqkv, d, part));
          }
        }
        return grads;
      },
      {"packed q, k and v", "output", "softmax statistics"}));
  return out;
}

}  // namespace

absl::StatusOr<Tensor> ScaledDotProductAttention(core::Arg q_arg, core::Arg k_arg, core::Arg v_arg,
                                                 const AttentionOptions& options) {
  ASSIGN_OR_RETURN(const Tensor q, Input("q", q_arg));
  ASSIGN_OR_RETURN(const Tensor k, Input("k", k_arg));
  ASSIGN_OR_RETURN(const Tensor v, Input("v", v_arg));
  RETURN_IF_ERROR(options.mask.status());
  ASSIGN_OR_RETURN(const Dims d, CheckShapes(q, k, v));
  const Tensor& mask = options.mask.tensor();
  Shape mask_shape(4, 1);
  if (mask.defined()) {
    ASSIGN_OR_RETURN(mask_shape, MaskShape(mask, q, d));
  }
  const float scale = options.scale.has_value()
                          ? *options.scale
                          : static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.D)));
  if (!std::isfinite(scale)) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": scale must be finite, got ", scale));
  }
  if (options.fused && options.causal && !mask.defined() && d.T == d.S && q.numel() > 0 &&
      FusedAttentionSupported(q.device(), d.D)) {
    return Fused(q, k, v, d, scale);
  }
  return Composite(q, k, v, mask, mask_shape, d, options.causal, scale);
}

}  // namespace functional
}  // namespace nn
