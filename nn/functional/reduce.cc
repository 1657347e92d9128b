#include "nn/functional/reduce.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "kernels/tensor.h"
#include "nn/functional/internal/tensor_args.h"
#include "nn/functional/internal/tensor_dispatch.h"
#include "nn/functional/shape.h"

namespace nn {
namespace functional {
namespace {

using core::DType;
using core::Shape;
using core::Tensor;
using internal::ContiguousStrides;
using internal::NewTensor;
using internal::RunExpand;
using internal::RunMax;
using internal::RunSum;

// A fresh `shape` tensor holding x expanded over `expanded`, times scale.
absl::StatusOr<Tensor> Expanded(absl::string_view what, const Tensor& x, const Shape& shape,
                                const std::vector<bool>& expanded, float scale) {
  ASSIGN_OR_RETURN(Tensor out, NewTensor(shape, x.device()));
  RETURN_IF_ERROR(RunExpand(what, x, expanded, scale, out));
  return out;
}

// The fp32 input of op `op`.
absl::StatusOr<Tensor> FloatInput(absl::string_view op, const core::Arg& arg) {
  ASSIGN_OR_RETURN(Tensor x, internal::Input(op, "input", arg));
  RETURN_IF_ERROR(internal::CheckFloat(op, "input", x));
  return x;
}

// Sum or Mean over the marked dims of x, into `out_shape`, recorded as `op`.
absl::StatusOr<Tensor> Reduce(const char* op, const Tensor& x, const std::vector<bool>& reduced,
                              const Shape& out_shape, bool mean) {
  int64_t count = 1;
  for (size_t d = 0; d < reduced.size(); ++d) count *= reduced[d] ? x.size(d) : 1;
  const double scale = !mean ? 1.0
                             : (count > 0 ? 1.0 / static_cast<double>(count)
                                          : std::numeric_limits<double>::quiet_NaN());
  ASSIGN_OR_RETURN(Tensor y, NewTensor(out_shape, x.device()));
  RETURN_IF_ERROR(RunSum(op, x, reduced, scale, y));
  RETURN_IF_ERROR(
      internal::RecordGradFn(op, x, &y, [op, x_shape = x.shape(), reduced, scale](const Tensor& g) {
        return Expanded(op, g, x_shape, reduced, static_cast<float>(scale));
      }));
  return y;
}

// Sum or Mean over `dims` (checked: at least one, in range, distinct).
absl::StatusOr<Tensor> ReduceDims(const char* op, const core::Arg& arg,
                                  const std::vector<int64_t>& dims, bool keepdim, bool mean) {
  ASSIGN_OR_RETURN(const Tensor x, FloatInput(op, arg));
  std::vector<bool> reduced(x.dim(), false);
  if (dims.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": dims is empty (reduce all of input ",
                                                   x.ToString(), " with ", op, "(x))"));
  }
  for (int64_t dim : dims) {
    ASSIGN_OR_RETURN(const int d, internal::NormalizeDim(op, "dim", x, dim));
    if (reduced[d]) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": dims [", absl::StrJoin(dims, ", "),
                                                     "] name dim ", d, " of input ", x.ToString(),
                                                     " twice"));
    }
    reduced[d] = true;
  }
  Shape out_shape;
  for (int d = 0; d < x.dim(); ++d) {
    if (!reduced[d]) {
      out_shape.push_back(x.size(d));
    } else if (keepdim) {
      out_shape.push_back(1);
    }
  }
  return Reduce(op, x, reduced, out_shape, mean);
}

absl::StatusOr<Tensor> ReduceAll(const char* op, const core::Arg& arg, bool mean) {
  ASSIGN_OR_RETURN(const Tensor x, FloatInput(op, arg));
  return Reduce(op, x, std::vector<bool>(x.dim(), true), {}, mean);
}

// The dims of `big` that broadcasting stretches `small` over (aligned from the right: the
// leading dims small lacks, and those where small has 1 and big another size), or
// InvalidArgument naming both shapes.
absl::StatusOr<std::vector<bool>> StretchedDims(absl::string_view op, const Shape& small,
                                                const Shape& big, absl::string_view what) {
  const size_t lead = big.size() - std::min(small.size(), big.size());
  bool fits = small.size() <= big.size();
  std::vector<bool> stretched(big.size(), true);
  for (size_t d = lead; fits && d < big.size(); ++d) {
    const int64_t s = small[d - lead];
    fits = s == big[d] || s == 1;
    stretched[d] = s != big[d];
  }
  if (!fits) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", what, " (shapes ", core::ShapeToString(small), " and ",
                     core::ShapeToString(big), " do not broadcast that way)"));
  }
  return stretched;
}

}  // namespace

absl::StatusOr<Tensor> Sum(core::Arg x) { return ReduceAll("Sum", x, /*mean=*/false); }

absl::StatusOr<Tensor> Mean(core::Arg x) { return ReduceAll("Mean", x, /*mean=*/true); }

absl::StatusOr<Tensor> Sum(core::Arg x, const std::vector<int64_t>& dims, bool keepdim) {
  return ReduceDims("Sum", x, dims, keepdim, /*mean=*/false);
}

absl::StatusOr<Tensor> Mean(core::Arg x, const std::vector<int64_t>& dims, bool keepdim) {
  return ReduceDims("Mean", x, dims, keepdim, /*mean=*/true);
}

absl::StatusOr<std::vector<Tensor>> Max(core::Arg x_arg, int64_t dim, bool keepdim) {
  ASSIGN_OR_RETURN(const Tensor x, FloatInput("Max", x_arg));
  ASSIGN_OR_RETURN(const int d, internal::NormalizeDim("Max", "dim", x, dim));
  const int64_t K = x.size(d);
  if (K == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Max: input ", x.ToString(), " is empty along dim ", d));
  }
  Shape keep_shape = x.shape();
  keep_shape[d] = 1;
  Shape out_shape = keep_shape;
  if (!keepdim) out_shape.erase(out_shape.begin() + d);
  ASSIGN_OR_RETURN(Tensor values, NewTensor(out_shape, x.device()));
  ASSIGN_OR_RETURN(Tensor indices, NewTensor(out_shape, x.device(), DType::kInt32));
  RETURN_IF_ERROR(RunMax("Max", x, d, values, indices));
  const Shape x_shape = x.shape();
  RETURN_IF_ERROR(core::RecordFunction(
      "Max", {x}, {&values, &indices}, {indices},
      [x_shape, keep_shape,
       d](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        // The values' gradient scattered to the indices along d, into zeros of x's shape.
        ASSIGN_OR_RETURN(const Tensor zeros, internal::NewZeros(x_shape, ctx.grad(0).device()));
        ASSIGN_OR_RETURN(const Tensor at, ctx.saved(0).Reshape(keep_shape));
        ASSIGN_OR_RETURN(const Tensor g, ctx.grad(0).Reshape(keep_shape));
        ASSIGN_OR_RETURN(Tensor gx, ScatterAdd(zeros, d, at, g));
        return std::vector<Tensor>{gx};
      },
      {"indices"}));
  return std::vector<Tensor>{values, indices};
}

absl::StatusOr<Tensor> SumToShape(core::Arg x_arg, const Shape& shape) {
  ASSIGN_OR_RETURN(const Tensor x, FloatInput("SumToShape", x_arg));
  ASSIGN_OR_RETURN(const std::vector<bool> reduced,
                   StretchedDims("SumToShape", shape, x.shape(),
                                 absl::StrCat("cannot sum input ", x.ToString(), " to ",
                                              core::ShapeToString(shape))));
  ASSIGN_OR_RETURN(Tensor y, NewTensor(shape, x.device()));
  RETURN_IF_ERROR(RunSum("SumToShape", x, reduced, 1.0, y));
  RETURN_IF_ERROR(internal::RecordGradFn(
      "SumToShape", x, &y,
      [x_shape = x.shape()](const Tensor& g) { return BroadcastTo(g, x_shape); }));
  return y;
}

absl::StatusOr<Tensor> BroadcastTo(core::Arg x_arg, const Shape& shape) {
  ASSIGN_OR_RETURN(const Tensor x, FloatInput("BroadcastTo", x_arg));
  bool negative = false;
  for (int64_t d : shape) negative = negative || d < 0;
  if (negative || shape.size() > static_cast<size_t>(kernels::kMaxTensorRank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("BroadcastTo: shape ", core::ShapeToString(shape),
                     " has a negative size or more than ", kernels::kMaxTensorRank, " dims"));
  }
  ASSIGN_OR_RETURN(const std::vector<bool> expanded,
                   StretchedDims("BroadcastTo", x.shape(), shape,
                                 absl::StrCat("cannot broadcast input ", x.ToString(), " to ",
                                              core::ShapeToString(shape))));
  ASSIGN_OR_RETURN(Tensor y, Expanded("BroadcastTo", x, shape, expanded, 1.0f));
  RETURN_IF_ERROR(internal::RecordGradFn(
      "BroadcastTo", x, &y,
      [x_shape = x.shape()](const Tensor& g) { return SumToShape(g, x_shape); }));
  return y;
}

}  // namespace functional
}  // namespace nn
