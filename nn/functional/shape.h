// Shape and indexing ops as differentiable free functions (torch.reshape, transpose,
// permute, narrow, cat, split, index_select, gather, scatter_add), on the CPU or CUDA.
// Tensors are contiguous and row-major (core::Tensor has no strides): Reshape aliases its
// input; every other op writes a fresh contiguous tensor.
//
//   namespace F = nn::functional;
//   // [B, T, H * D] -> [B, H, T, D]:
//   absl::StatusOr<core::Tensor> heads = F::Permute(F::Reshape(x, {B, T, H, -1}), {0, 2, 1, 3});
//   absl::StatusOr<std::vector<core::Tensor>> qkv = F::Split(x, {C, C, C}, -1);
//
// Conventions: dims may be negative (counted from the end); ranks are at most 8
// (kernels::kMaxTensorRank) except for Reshape. The data ops take float32 or int32 tensors
// (int32 ones carry no gradient); the gradients are float32. Errors are InvalidArgument
// "<Op>: ..." naming the argument and its shape; an Arg's own error is returned unchanged.
//
// NOTE [Index checks]: on the CPU, IndexSelect, Gather and ScatterAdd check every index
// value before any work (InvalidArgument naming the value, its position and the size it
// must be below). On CUDA the values stay on the device and are not checked (that would
// wait for the device): a gathered element whose index is out of range reads as 0 and a
// scattered one is skipped, so nothing is read or written out of bounds. Their backward
// sums repeated indices in index order, one thread per output element on CUDA, so
// gradients have the same bits on every run and on both devices.
#ifndef NN_FUNCTIONAL_SHAPE_H_
#define NN_FUNCTIONAL_SHAPE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/autograd.h"
#include "core/tensor.h"

namespace nn {
namespace functional {

// x's elements under `shape` (one entry may be -1: the size that makes the element counts
// equal), aliasing x's storage. Gradient: the output's, reshaped to x's shape. Any dtype.
// InvalidArgument when the counts differ, for two -1s or another negative size.
absl::StatusOr<core::Tensor> Reshape(core::Arg x, const core::Shape& shape);

// x with dims dim0 and dim1 swapped (a copy). Gradient: the output's swapped back.
absl::StatusOr<core::Tensor> Transpose(core::Arg x, int64_t dim0, int64_t dim1);

// x with its dims reordered: output dim i is x's dim dims[i] (a copy). `dims` must be a
// permutation of x's dims. Gradient: the inverse permutation of the output's.
absl::StatusOr<core::Tensor> Permute(core::Arg x, const std::vector<int64_t>& dims);

// Elements [start, end) of x along `dim` (a copy; step 1). start and end are clamped as
// Python slices are: negative values count from the end, then both are clamped to
// [0, size] and end to at least start (an empty slice). Gradient: the output's, written
// into zeros of x's shape.
absl::StatusOr<core::Tensor> Slice(core::Arg x, int64_t dim, int64_t start, int64_t end);

// The tensors joined along `dim`: at least one, of one rank, dtype and device, with equal
// sizes in every other dim. Gradient: each input's slice of the output's.
absl::StatusOr<core::Tensor> Cat(const std::vector<core::Arg>& xs, int64_t dim);

// x cut along `dim` into pieces of `sizes` (non-negative, summing to x's size there), one
// fresh tensor each. Gradient: the pieces' gradients joined (zeros for a piece no loss used).
absl::StatusOr<std::vector<core::Tensor>> Split(core::Arg x, const std::vector<int64_t>& sizes,
                                                int64_t dim);

// out = x with dim `dim` replaced by index's entries: out[..., i, ...] = x[..., index[i], ...]
// (torch.index_select); index int32 1-D on x's device (NOTE [Index checks]). Gradient of x:
// the output's gradient added at the selected positions (repeats summed in index order).
absl::StatusOr<core::Tensor> IndexSelect(core::Arg x, int64_t dim, core::Arg index);

// out[i0, .., i_dim, ..] = x[i0, .., index[i0, .., i_dim, ..], ..] (torch.gather): index
// int32 of x's rank on x's device, no larger than x in any dim but `dim`; out has index's
// shape (NOTE [Index checks]). Gradient of x: the output's gradient added where it was read
// from (repeats summed in index order).
absl::StatusOr<core::Tensor> Gather(core::Arg x, int64_t dim, core::Arg index);

// out = x with src added at index along `dim` (torch.scatter_add): out[.., index[p], ..] +=
// src[.., p, ..] for every position p of index (int32, of x's rank; no larger than src in
// any dim, nor than x in any dim but `dim`; NOTE [Index checks]). Repeated targets add in
// index order. x and src float32 of one rank. Gradients: x's is the output's; src's is the
// output's gradient gathered at index (zeros where src is larger than index).
absl::StatusOr<core::Tensor> ScatterAdd(core::Arg x, int64_t dim, core::Arg index, core::Arg src);

}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_SHAPE_H_
