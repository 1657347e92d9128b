#include "nn/functional/shape.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "kernels/tensor.h"
#include "nn/functional/internal/tensor_args.h"
#include "nn/functional/internal/tensor_dispatch.h"
#include "nn/internal/op_checks.h"

namespace nn {
namespace functional {
namespace {

using core::DType;
using core::Shape;
using core::Tensor;
using internal::ContiguousStrides;
using internal::CopyStrided;
using internal::Input;
using internal::MakeIter;
using internal::NewTensor;
using internal::NewZeros;
using internal::NormalizeDim;
using internal::RunGather;
using internal::RunScatterAdd;

// InvalidArgument unless t is fp32 or int32: the 4-byte elements the copies move.
absl::Status CheckCopyable(absl::string_view op, absl::string_view name, const Tensor& t) {
  if (t.dtype() == DType::kFloat32 || t.dtype() == DType::kInt32) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", name, " must be float32 or int32, got ", t.ToString()));
}

// dst (contiguous) = src's elements [start, start + dst.size(dim)) along dim.
absl::Status CopyOutOfSlice(absl::string_view what, const Tensor& src, int dim, int64_t start,
                            const Tensor& dst) {
  const Shape strides = ContiguousStrides(src.shape());
  return CopyStrided(what, src, start * strides[dim], strides, dst, 0,
                     ContiguousStrides(dst.shape()), dst.shape());
}

// dst's elements [start, start + src.size(dim)) along dim = src (contiguous).
absl::Status CopyIntoSlice(absl::string_view what, const Tensor& src, const Tensor& dst, int dim,
                           int64_t start) {
  const Shape strides = ContiguousStrides(dst.shape());
  return CopyStrided(what, src, 0, ContiguousStrides(src.shape()), dst, start * strides[dim],
                     strides, src.shape());
}

// NOTE [Index checks]: on the CPU, every value of `index` (int32) in [0, size); on CUDA
// nothing is checked.
absl::Status CheckIndexValues(absl::string_view op, const Tensor& index, int64_t size,
                              const Tensor& x, int dim) {
  if (!index.device().is_cpu()) return absl::OkStatus();
  const int32_t* v = index.data<int32_t>();
  for (int64_t i = 0; i < index.numel(); ++i) {
    if (!kernels::IndexInRange(v[i], size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": index value ", v[i], " at flat position ", i, " of index ", index.ToString(),
          " is outside [0, ", size, ") for dim ", dim, " of input ", x.ToString()));
    }
  }
  return absl::OkStatus();
}

// The index argument: defined, int32 and on x's device (its values: CheckIndexValues).
absl::StatusOr<Tensor> IndexInput(absl::string_view op, const core::Arg& arg, const Tensor& x) {
  ASSIGN_OR_RETURN(const Tensor index, Input(op, "index", arg));
  RETURN_IF_ERROR(::nn::internal::CheckDType(op, "index", index, DType::kInt32));
  RETURN_IF_ERROR(internal::CheckSameDevice(op, "input", x, "index", index));
  return index;
}

// The geometry of a gather or scatter over index shape `sizes` into data of `data_shape`.
kernels::GatherScatter MakeGatherScatter(int dim, const Shape& sizes, const Shape& data_shape,
                                         const Shape& index_strides, const Shape& other_strides) {
  kernels::GatherScatter g;
  g.rank = static_cast<int>(sizes.size());
  g.dim = dim;
  for (int d = 0; d < g.rank; ++d) {
    g.sizes[d] = sizes[d];
    g.data_sizes[d] = data_shape[d];
    g.index_strides[d] = index_strides[d];
    g.other_strides[d] = other_strides[d];
  }
  return g;
}

// Records the gather `op` of y from x by index over g: the gradient of x is y's gradient
// scattered by g into zeros of x's shape (repeats added in index order).
absl::Status RecordGather(const char* op, const Tensor& x, const Tensor& index,
                          const kernels::GatherScatter& g, Tensor* y) {
  return core::RecordFunction(
      op, {x, index}, {y}, {index},
      [op, x_shape = x.shape(),
       g](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        const Tensor& gy = ctx.grad(0);
        ASSIGN_OR_RETURN(Tensor gx, NewZeros(x_shape, gy.device()));
        RETURN_IF_ERROR(RunScatterAdd(op, gy, ctx.saved(0), gx, g));
        return std::vector<Tensor>{gx, Tensor()};
      },
      {"index"});
}

// InvalidArgument unless index (rank r) fits `t` in every dim (but `except`, when >= 0).
absl::Status CheckIndexFits(absl::string_view op, const Tensor& index, const char* t_name,
                            const Tensor& t, int except) {
  if (index.dim() != t.dim()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": index ", index.ToString(), " must have the rank of ", t_name, " ", t.ToString()));
  }
  for (int d = 0; d < t.dim(); ++d) {
    if (d != except && index.size(d) > t.size(d)) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": index ", index.ToString(),
                                                     " is larger than ", t_name, " ", t.ToString(),
                                                     " in dim ", d));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Tensor> Reshape(core::Arg x_arg, const Shape& shape) {
  RETURN_IF_ERROR(x_arg.status());
  const Tensor& x = x_arg.tensor();
  if (!x.defined()) return absl::InvalidArgumentError("Reshape: input is undefined");
  Shape target = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t d = 0; d < target.size(); ++d) {
    if (target[d] == -1 && infer < 0) {
      infer = static_cast<int>(d);
    } else if (target[d] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Reshape: shape ", core::ShapeToString(shape), " for input ", x.ToString(),
                       " may hold one -1 and no other negative size"));
    } else {
      known *= target[d];
    }
  }
  if (infer >= 0 && known > 0 && x.numel() % known == 0) target[infer] = x.numel() / known;
  if ((infer >= 0 && target[infer] < 0) || core::NumElements(target) != x.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("Reshape: input ", x.ToString(), " of ",
                                                   x.numel(), " elements cannot take shape ",
                                                   core::ShapeToString(shape)));
  }
  ASSIGN_OR_RETURN(Tensor y, x.Reshape(target));
  RETURN_IF_ERROR(internal::RecordGradFn(
      "Reshape", x, &y, [x_shape = x.shape()](const Tensor& g) { return g.Reshape(x_shape); }));
  return y;
}

absl::StatusOr<Tensor> Transpose(core::Arg x_arg, int64_t dim0, int64_t dim1) {
  ASSIGN_OR_RETURN(const Tensor x, Input("Transpose", "input", x_arg));
  ASSIGN_OR_RETURN(const int d0, NormalizeDim("Transpose", "dim0", x, dim0));
  ASSIGN_OR_RETURN(const int d1, NormalizeDim("Transpose", "dim1", x, dim1));
  std::vector<int64_t> dims(x.dim());
  for (int d = 0; d < x.dim(); ++d) dims[d] = d;
  std::swap(dims[d0], dims[d1]);
  return Permute(x, dims);
}

absl::StatusOr<Tensor> Permute(core::Arg x_arg, const std::vector<int64_t>& dims) {
  ASSIGN_OR_RETURN(const Tensor x, Input("Permute", "input", x_arg));
  RETURN_IF_ERROR(CheckCopyable("Permute", "input", x));
  const int rank = static_cast<int>(x.dim());
  std::vector<int64_t> inverse(rank, -1);
  bool valid = static_cast<int>(dims.size()) == rank;
  for (int i = 0; valid && i < rank; ++i) {
    const int64_t d = dims[i] < 0 ? dims[i] + rank : dims[i];
    valid = d >= 0 && d < rank && inverse[d] < 0;
    if (valid) inverse[d] = i;
  }
  if (!valid) {
    return absl::InvalidArgumentError(absl::StrCat("Permute: dims [", absl::StrJoin(dims, ", "),
                                                   "] are not a permutation of the dims of ",
                                                   x.ToString()));
  }
  const Shape x_strides = ContiguousStrides(x.shape());
  Shape out_shape(rank), src_strides(rank);
  for (int i = 0; i < rank; ++i) {
    const int d = static_cast<int>(dims[i] < 0 ? dims[i] + rank : dims[i]);
    out_shape[i] = x.size(d);
    src_strides[i] = x_strides[d];
  }
  ASSIGN_OR_RETURN(Tensor y, NewTensor(out_shape, x.device(), x.dtype()));
  RETURN_IF_ERROR(
      CopyStrided("Permute", x, 0, src_strides, y, 0, ContiguousStrides(out_shape), out_shape));
  RETURN_IF_ERROR(internal::RecordGradFn(
      "Permute", x, &y, [inverse](const Tensor& g) { return Permute(g, inverse); }));
  return y;
}

absl::StatusOr<Tensor> Slice(core::Arg x_arg, int64_t dim, int64_t start, int64_t end) {
  ASSIGN_OR_RETURN(const Tensor x, Input("Slice", "input", x_arg));
  RETURN_IF_ERROR(CheckCopyable("Slice", "input", x));
  ASSIGN_OR_RETURN(const int d, NormalizeDim("Slice", "dim", x, dim));
  const int64_t size = x.size(d);
  auto clamp = [size](int64_t v) {
    if (v < 0) v += size;
    return v < 0 ? 0 : (v > size ? size : v);
  };
  const int64_t b = clamp(start), e = std::max(b, clamp(end));
  Shape out_shape = x.shape();
  out_shape[d] = e - b;
  ASSIGN_OR_RETURN(Tensor y, NewTensor(out_shape, x.device(), x.dtype()));
  RETURN_IF_ERROR(CopyOutOfSlice("Slice", x, d, b, y));
  RETURN_IF_ERROR(internal::RecordGradFn(
      "Slice", x, &y, [x_shape = x.shape(), d, b](const Tensor& g) -> absl::StatusOr<Tensor> {
        ASSIGN_OR_RETURN(Tensor gx, NewZeros(x_shape, g.device()));
        RETURN_IF_ERROR(CopyIntoSlice("Slice backward", g, gx, d, b));
        return gx;
      }));
  return y;
}

absl::StatusOr<Tensor> Cat(const std::vector<core::Arg>& xs, int64_t dim) {
  if (xs.empty()) return absl::InvalidArgumentError("Cat: needs at least one tensor");
  std::vector<Tensor> ins;
  ins.reserve(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    ASSIGN_OR_RETURN(Tensor t, Input("Cat", absl::StrCat("tensor ", i), xs[i]));
    ins.push_back(std::move(t));
  }
  const Tensor& first = ins[0];
  RETURN_IF_ERROR(CheckCopyable("Cat", "tensor 0", first));
  ASSIGN_OR_RETURN(const int d, NormalizeDim("Cat", "dim", first, dim));
  Shape out_shape = first.shape();
  out_shape[d] = 0;
  for (size_t i = 0; i < ins.size(); ++i) {
    const Tensor& t = ins[i];
    bool fits = t.dim() == first.dim() && t.dtype() == first.dtype();
    for (int k = 0; fits && k < t.dim(); ++k) fits = k == d || t.size(k) == first.size(k);
    if (!fits) {
      return absl::InvalidArgumentError(absl::StrCat("Cat: tensor ", i, " ", t.ToString(),
                                                     " does not match tensor 0 ", first.ToString(),
                                                     " outside dim ", d));
    }
    RETURN_IF_ERROR(
        internal::CheckSameDevice("Cat", "tensor 0", first, absl::StrCat("tensor ", i), t));
    out_shape[d] += t.size(d);
  }
  ASSIGN_OR_RETURN(Tensor y, NewTensor(out_shape, first.device(), first.dtype()));
  std::vector<int64_t> starts(ins.size());
  int64_t start = 0;
  for (size_t i = 0; i < ins.size(); ++i) {
    starts[i] = start;
    RETURN_IF_ERROR(CopyIntoSlice("Cat", ins[i], y, d, start));
    start += ins[i].size(d);
  }
  std::vector<int64_t> ends(ins.size());
  for (size_t i = 0; i < ins.size(); ++i) ends[i] = starts[i] + ins[i].size(d);
  RETURN_IF_ERROR(core::RecordFunction(
      "Cat", ins, {&y}, {},
      [d, starts, ends](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        std::vector<Tensor> grads(starts.size());
        for (size_t i = 0; i < starts.size(); ++i) {
          if (!ctx.needs_grad(static_cast<int>(i))) continue;
          ASSIGN_OR_RETURN(grads[i], Slice(ctx.grad(0), d, starts[i], ends[i]));
        }
        return grads;
      }));
  return y;
}

absl::StatusOr<std::vector<Tensor>> Split(core::Arg x_arg, const std::vector<int64_t>& sizes,
                                          int64_t dim) {
  ASSIGN_OR_RETURN(const Tensor x, Input("Split", "input", x_arg));
  RETURN_IF_ERROR(CheckCopyable("Split", "input", x));
  ASSIGN_OR_RETURN(const int d, NormalizeDim("Split", "dim", x, dim));
  int64_t total = 0;
  bool valid = !sizes.empty();
  for (int64_t s : sizes) {
    valid = valid && s >= 0;
    total += s;
  }
  if (!valid || total != x.size(d)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Split: sizes [", absl::StrJoin(sizes, ", "), "] must be non-negative and sum to ",
        x.size(d), ", the size of dim ", d, " of input ", x.ToString()));
  }
  std::vector<Tensor> outs(sizes.size());
  std::vector<Tensor*> out_ptrs(sizes.size());
  int64_t start = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    Shape shape = x.shape();
    shape[d] = sizes[i];
    ASSIGN_OR_RETURN(outs[i], NewTensor(shape, x.device(), x.dtype()));
    RETURN_IF_ERROR(CopyOutOfSlice("Split", x, d, start, outs[i]));
    out_ptrs[i] = &outs[i];
    start += sizes[i];
  }
  RETURN_IF_ERROR(core::RecordFunction(
      "Split", {x}, out_ptrs, {},
      [d, pieces = static_cast<int>(sizes.size())](
          const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        // One gradient per piece (zeros where none arrived).
        std::vector<core::Arg> grads;
        for (int i = 0; i < pieces; ++i) grads.emplace_back(ctx.grad(i));
        ASSIGN_OR_RETURN(Tensor gx, Cat(grads, d));
        return std::vector<Tensor>{gx};
      }));
  return outs;
}

absl::StatusOr<Tensor> IndexSelect(core::Arg x_arg, int64_t dim, core::Arg index_arg) {
  ASSIGN_OR_RETURN(const Tensor x, Input("IndexSelect", "input", x_arg));
  RETURN_IF_ERROR(internal::CheckFloat("IndexSelect", "input", x));
  ASSIGN_OR_RETURN(const int d, NormalizeDim("IndexSelect", "dim", x, dim));
  ASSIGN_OR_RETURN(const Tensor index, IndexInput("IndexSelect", index_arg, x));
  if (index.dim() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("IndexSelect: index must be 1-D, got ", index.ToString()));
  }
  RETURN_IF_ERROR(CheckIndexValues("IndexSelect", index, x.size(d), x, d));
  Shape out_shape = x.shape();
  out_shape[d] = index.numel();
  Shape index_strides(x.dim(), 0);
  index_strides[d] = 1;
  const kernels::GatherScatter g =
      MakeGatherScatter(d, out_shape, x.shape(), index_strides, ContiguousStrides(out_shape));
  ASSIGN_OR_RETURN(Tensor y, NewTensor(out_shape, x.device()));
  RETURN_IF_ERROR(RunGather("IndexSelect", x, index, y, g));
  RETURN_IF_ERROR(RecordGather("IndexSelect", x, index, g, &y));
  return y;
}

absl::StatusOr<Tensor> Gather(core::Arg x_arg, int64_t dim, core::Arg index_arg) {
  ASSIGN_OR_RETURN(const Tensor x, Input("Gather", "input", x_arg));
  RETURN_IF_ERROR(internal::CheckFloat("Gather", "input", x));
  ASSIGN_OR_RETURN(const int d, NormalizeDim("Gather", "dim", x, dim));
  ASSIGN_OR_RETURN(const Tensor index, IndexInput("Gather", index_arg, x));
  RETURN_IF_ERROR(CheckIndexFits("Gather", index, "input", x, d));
  RETURN_IF_ERROR(CheckIndexValues("Gather", index, x.size(d), x, d));
  const Shape strides = ContiguousStrides(index.shape());
  const kernels::GatherScatter g = MakeGatherScatter(d, index.shape(), x.shape(), strides, strides);
  ASSIGN_OR_RETURN(Tensor y, NewTensor(index.shape(), x.device()));
  RETURN_IF_ERROR(RunGather("Gather", x, index, y, g));
  RETURN_IF_ERROR(RecordGather("Gather", x, index, g, &y));
  return y;
}

absl::StatusOr<Tensor> ScatterAdd(core::Arg x_arg, int64_t dim, core::Arg index_arg,
                                  core::Arg src_arg) {
  ASSIGN_OR_RETURN(const Tensor x, Input("ScatterAdd", "input", x_arg));
  RETURN_IF_ERROR(internal::CheckFloat("ScatterAdd", "input", x));
  ASSIGN_OR_RETURN(const int d, NormalizeDim("ScatterAdd", "dim", x, dim));
  ASSIGN_OR_RETURN(const Tensor index, IndexInput("ScatterAdd", index_arg, x));
  ASSIGN_OR_RETURN(const Tensor src, Input("ScatterAdd", "src", src_arg));
  RETURN_IF_ERROR(internal::CheckFloat("ScatterAdd", "src", src));
  RETURN_IF_ERROR(internal::CheckSameDevice("ScatterAdd", "input", x, "src", src));
  RETURN_IF_ERROR(CheckIndexFits("ScatterAdd", index, "input", x, d));
  RETURN_IF_ERROR(CheckIndexFits("ScatterAdd", index, "src", src, -1));
  RETURN_IF_ERROR(CheckIndexValues("ScatterAdd", index, x.size(d), x, d));
  const kernels::GatherScatter g =
      MakeGatherScatter(d, index.shape(), x.shape(), ContiguousStrides(index.shape()),
                        ContiguousStrides(src.shape()));
  ASSIGN_OR_RETURN(Tensor y, NewTensor(x.shape(), x.device()));
  RETURN_IF_ERROR(CopyOutOfSlice("ScatterAdd", x, d, 0, y));
  RETURN_IF_ERROR(RunScatterAdd("ScatterAdd", src, index, y, g));
  const Shape src_shape = src.shape();
  RETURN_IF_ERROR(core::RecordFunction(
      "ScatterAdd", {x, index, src}, {&y}, {index},
      [src_shape, g](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        const Tensor& gy = ctx.grad(0);
        Tensor gsrc;
        if (ctx.needs_grad(2)) {
          ASSIGN_OR_RETURN(gsrc, NewZeros(src_shape, gy.device()));
          RETURN_IF_ERROR(RunGather("ScatterAdd backward", gy, ctx.saved(0), gsrc, g));
        }
        return std::vector<Tensor>{ctx.needs_grad(0) ? gy : Tensor(), Tensor(), gsrc};
      },
      {"index"}));
  return y;
}

}  // namespace functional
}  // namespace nn
