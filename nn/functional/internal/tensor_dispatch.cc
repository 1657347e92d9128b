#include "nn/functional/internal/tensor_dispatch.h"

#include <cstdint>
#include <vector>

#include "core/op_profile.h"
#include "core/status_macros.h"
#include "kernels/cpu/tensor_kernels.h"
#include "kernels/tensor.h"
#include "nn/functional/internal/tensor_args.h"
#include "nn/internal/op_checks.h"
#include "nn/internal/op_costs.h"

#ifdef FSDP_WITH_CUDA
#include "kernels/cuda/tensor_kernels.h"
#endif

namespace nn {
namespace functional {
namespace internal {
namespace {

namespace kcpu = ::kernels::cpu;
#ifdef FSDP_WITH_CUDA
namespace kc = ::kernels::cuda;
#endif
using core::OpCategory;
using core::ProfiledOp;
using core::Shape;
using core::Tensor;
using ::nn::internal::F32;
using ::nn::internal::MutF32;

// The strides of an operand of `shape` broadcast to `out` (NOTE [Broadcasting]).
Shape BroadcastStrides(const Shape& shape, const Shape& out) {
  const Shape own = internal::ContiguousStrides(shape);
  const size_t lead = out.size() - shape.size();
  Shape strides(out.size(), 0);
  for (size_t d = lead; d < out.size(); ++d) {
    strides[d] = shape[d - lead] == 1 ? 0 : own[d - lead];
  }
  return strides;
}

// A reduction's geometry over a tensor of `shape`: the dims marked in `reduced` are summed
// (the terms), the others kept (the outputs, stored contiguously in order).
struct Reduction {
  kernels::StridedIter<1> outer;
  kernels::StridedIter<1> terms;
  int64_t count = 1;  // terms per output
};

Reduction MakeReduction(const Shape& shape, const std::vector<bool>& reduced) {
  const Shape strides = ContiguousStrides(shape);
  Shape kept_sizes, kept_strides, term_sizes, term_strides;
  for (size_t d = 0; d < shape.size(); ++d) {
    (reduced[d] ? term_sizes : kept_sizes).push_back(shape[d]);
    (reduced[d] ? term_strides : kept_strides).push_back(strides[d]);
  }
  Reduction r;
  r.outer = internal::MakeIter<1>(kept_sizes, {kept_strides});
  r.terms = internal::MakeIter<1>(term_sizes, {term_strides});
  r.count = core::NumElements(term_sizes);
  kernels::CoalesceDims(&r.outer);
  kernels::CoalesceDims(&r.terms);
  return r;
}

}  // namespace

absl::Status RunBinary(absl::string_view what, int kind, const Tensor& a, const Tensor& b,
                       const Tensor& out) {
  static constexpr const char* kNames[] = {"binary.add", "binary.sub", "binary.mul", "binary.div"};
  const Shape& shape = out.shape();
  kernels::StridedIter<2> it = internal::MakeIter<2>(
      shape, {BroadcastStrides(a.shape(), shape), BroadcastStrides(b.shape(), shape)});
  kernels::CoalesceDims(&it);
  ProfiledOp op(
      OpCategory::kElementwise, kNames[kind], a.device(),
      core::OpCost::Memory(4.0 * (a.numel() + b.numel() + out.numel()), 1.0 * out.numel()));
  if (a.device().is_cuda()) {
    NN_ON_CUDA(a.device(), what, kNames[kind], kc::Binary(kind, F32(a), F32(b), MutF32(out), it));
  }
  kcpu::Binary(kind, F32(a), F32(b), MutF32(out), it);
  return absl::OkStatus();
}

absl::Status RunUnary(absl::string_view what, int kind, const Tensor& x, float c, const Tensor& y) {
  static constexpr const char* kNames[] = {"unary.add_scalar", "unary.mul_scalar", "silu.forward",
                                           "tanh.forward", "softplus.forward"};
  const int64_t n = x.numel();
  const int flops = kind == kernels::kUnarySilu || kind == kernels::kUnarySoftplus ? 8 : 1;
  ProfiledOp op(OpCategory::kElementwise, kNames[kind], x.device(),
                ::nn::internal::ElementwiseCost(n, 2, flops));
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, kNames[kind], kc::Unary(kind, F32(x), MutF32(y), n, c));
  }
  kcpu::Unary(kind, F32(x), MutF32(y), n, c);
  return absl::OkStatus();
}

absl::Status RunUnaryGrad(absl::string_view what, int kind, const Tensor& v, const Tensor& g,
                          const Tensor& gx) {
  const char* name = kind == kernels::kUnarySilu       ? "silu.backward"
                     : kind == kernels::kUnarySoftplus ? "softplus.backward"
                                                       : "tanh.backward";
  const int64_t n = v.numel();
  const int flops = kind == kernels::kUnarySilu ? 10 : kind == kernels::kUnarySoftplus ? 7 : 3;
  ProfiledOp op(OpCategory::kElementwise, name, v.device(),
                ::nn::internal::ElementwiseCost(n, 3, flops));
  if (v.device().is_cuda()) {
    NN_ON_CUDA(v.device(), what, name, kc::UnaryGrad(kind, F32(v), F32(g), MutF32(gx), n));
  }
  kcpu::UnaryGrad(kind, F32(v), F32(g), MutF32(gx), n);
  return absl::OkStatus();
}

absl::Status CopyStrided(absl::string_view what, const Tensor& src, int64_t src_offset,
                         const Shape& src_strides, const Tensor& dst, int64_t dst_offset,
                         const Shape& dst_strides, const Shape& sizes) {
  kernels::StridedIter<2> it = MakeIter<2>(sizes, {src_strides, dst_strides});
  kernels::CoalesceDims(&it);
  const int64_t n = kernels::IterSize(it);
  ProfiledOp op(OpCategory::kElementwise, "strided_copy", src.device(),
                ::nn::internal::ElementwiseCost(n, 2, 0));
  const void* s = static_cast<const char*>(src.raw_data()) + 4 * src_offset;
  void* d = static_cast<char*>(dst.raw_data()) + 4 * dst_offset;
  if (src.device().is_cuda()) {
    NN_ON_CUDA(src.device(), what, "strided copy", kc::StridedCopy(s, d, it));
  }
  kcpu::StridedCopy(s, d, it);
  return absl::OkStatus();
}

absl::Status RunGather(absl::string_view what, const Tensor& data, const Tensor& index,
                       const Tensor& out, const kernels::GatherScatter& g) {
  const int64_t n = kernels::GatherScatterSize(g);
  ProfiledOp op(OpCategory::kElementwise, "index.gather", data.device(),
                ::nn::internal::ElementwiseCost(n, 3, 0));
  const float* d = ::nn::internal::F32(data);
  const int32_t* idx = static_cast<const int32_t*>(index.raw_data());
  float* o = ::nn::internal::MutF32(out);
  if (data.device().is_cuda()) NN_ON_CUDA(data.device(), what, "gather", kc::Gather(d, idx, o, g));
  kcpu::Gather(d, idx, o, g);
  return absl::OkStatus();
}

absl::Status RunScatterAdd(absl::string_view what, const Tensor& src, const Tensor& index,
                           const Tensor& data, const kernels::GatherScatter& g) {
  const int64_t n = kernels::GatherScatterSize(g);
  ProfiledOp op(OpCategory::kElementwise, "index.scatter_add", data.device(),
                core::OpCost::Memory(12.0 * n + 8.0 * data.numel(), 1.0 * n));
  const float* s = ::nn::internal::F32(src);
  const int32_t* idx = static_cast<const int32_t*>(index.raw_data());
  float* d = ::nn::internal::MutF32(data);
  if (data.device().is_cuda()) {
    NN_ON_CUDA(data.device(), what, "scatter add", kc::ScatterAdd(s, idx, d, g));
  }
  kcpu::ScatterAdd(s, idx, d, g);
  return absl::OkStatus();
}

absl::Status RunSum(absl::string_view what, const Tensor& x, const std::vector<bool>& reduced,
                    double scale, const Tensor& out) {
  const Reduction r = MakeReduction(x.shape(), reduced);
  const int64_t outputs = kernels::IterSize(r.outer);
  const int64_t chunks = kernels::SumChunks(r.count);
  Tensor scratch;  // the chunks' double sums, when there is more than one chunk
  if (chunks > 1 && outputs > 0) {
    ASSIGN_OR_RETURN(scratch, NewTensor({2 * outputs * chunks}, x.device()));
  }
  double* partial = scratch.defined() ? static_cast<double*>(scratch.raw_data()) : nullptr;
  ProfiledOp op(
      OpCategory::kElementwise, "reduce.sum", x.device(),
      core::OpCost::Memory(4.0 * x.numel() + 4.0 * outputs, 1.0 * x.numel(), chunks > 1 ? 2 : 1));
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "sum",
               kc::Sum(F32(x), MutF32(out), r.outer, r.terms, scale, partial));
  }
  kcpu::Sum(F32(x), MutF32(out), r.outer, r.terms, scale, partial);
  return absl::OkStatus();
}

absl::Status RunExpand(absl::string_view what, const Tensor& x, const std::vector<bool>& expanded,
                       float scale, const Tensor& out) {
  const Shape& shape = out.shape();
  Shape kept;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!expanded[d]) kept.push_back(shape[d]);
  }
  const Shape kept_strides = ContiguousStrides(kept);
  Shape strides(shape.size(), 0);
  for (size_t d = 0, k = 0; d < shape.size(); ++d) {
    if (!expanded[d]) strides[d] = kept_strides[k++];
  }
  kernels::StridedIter<1> it = internal::MakeIter<1>(shape, {strides});
  kernels::CoalesceDims(&it);
  ProfiledOp op(OpCategory::kElementwise, "reduce.expand", x.device(),
                ::nn::internal::ElementwiseCost(out.numel(), 1, 1));
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "expand", kc::ExpandScaled(F32(x), MutF32(out), it, scale));
  }
  kcpu::ExpandScaled(F32(x), MutF32(out), it, scale);
  return absl::OkStatus();
}

absl::Status RunMax(absl::string_view what, const Tensor& x, int d, const Tensor& values,
                    const Tensor& indices) {
  std::vector<bool> along(x.dim(), false);
  along[d] = true;
  const Reduction r = MakeReduction(x.shape(), along);
  const int64_t stride = ContiguousStrides(x.shape())[d], K = x.size(d);
  int32_t* idx = static_cast<int32_t*>(indices.raw_data());
  ProfiledOp op(OpCategory::kElementwise, "reduce.max", x.device(),
                core::OpCost::Memory(4.0 * x.numel() + 8.0 * values.numel(), 1.0 * x.numel()));
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "max",
               kc::MaxAlongDim(F32(x), MutF32(values), idx, r.outer, stride, K));
  }
  kcpu::MaxAlongDim(F32(x), MutF32(values), idx, r.outer, stride, K);
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace functional
}  // namespace nn
