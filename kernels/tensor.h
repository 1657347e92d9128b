// Kernel bodies of nn/functional's general tensor ops: the index math of strided
// iteration (broadcast, permutation, slices), gather and scatter along a dimension, and the
// element math of binary and unary ops, sums and maxima. Written once as FSDP_HD functions:
// the CPU launchers (kernels/cpu/tensor_kernels.h) and the CUDA launchers
// (kernels/cuda/tensor_kernels.h) call them, so the CPU tests check the GPU's math.
//
//   // out [2, 3] = a [2, 3] + b [3] (b broadcast along dim 0):
//   kernels::StridedIter<2> it = {2, {2, 3}, {{3, 1}, {0, 1}}};
//   int64_t off[2];
//   for (int64_t i = 0; i < kernels::IterSize(it); ++i) {
//     kernels::StridedOffsets(it, i, off);
//     out[i] = kernels::BinaryOp(kernels::kBinaryAdd, a[off[0]], b[off[1]]);
//   }
//
// NOTE [Strided iteration]: an op walks the elements of an iteration shape (`sizes`,
// row-major, numbered i = 0 .. IterSize - 1) and finds operand t's element for i at
// offset sum_d coord_d(i) * strides[t][d]. A broadcast operand has stride 0 along the dims
// it is stretched over, a permuted one its strides in the new order, a slice its parent's
// strides from a start offset. Ranks are at most kMaxTensorRank; CoalesceDims merges the
// dims every operand walks contiguously (and drops size-1 dims) before a launch, so the
// index math runs on the fewest dims. The struct is passed by value to CUDA kernels.
#ifndef KERNELS_TENSOR_H_
#define KERNELS_TENSOR_H_

#include <stdint.h>

#include "core/hd.h"
#include "kernels/elementwise.h"
#include "kernels/math.h"

namespace kernels {

constexpr int kMaxTensorRank = 8;

// N operands' strides over one iteration shape (NOTE [Strided iteration]).
template <int N>
struct StridedIter {
  int rank = 0;
  int64_t sizes[kMaxTensorRank] = {};
  int64_t strides[N][kMaxTensorRank] = {};
};

// Elements of the iteration shape (1 for rank 0).
template <int N>
FSDP_HD inline int64_t IterSize(const StridedIter<N>& it) {
  int64_t n = 1;
  for (int d = 0; d < it.rank; ++d) n *= it.sizes[d];
  return n;
}

// off[t] = operand t's offset for element i.
template <int N>
FSDP_HD inline void StridedOffsets(const StridedIter<N>& it, int64_t i, int64_t* off) {
  for (int t = 0; t < N; ++t) off[t] = 0;
  for (int d = it.rank - 1; d > 0; --d) {
    const int64_t q = i / it.sizes[d];
    const int64_t c = i - q * it.sizes[d];
    for (int t = 0; t < N; ++t) off[t] += c * it.strides[t][d];
    i = q;
  }
  if (it.rank > 0) {
    for (int t = 0; t < N; ++t) off[t] += i * it.strides[t][0];
  }
}

// Host: drops size-1 dims and merges dim d into d - 1 where every operand steps over d
// exactly once per step of d - 1 (strides[t][d - 1] == strides[t][d] * sizes[d]). Walks
// the same elements in the same order. An empty shape (a size 0) is left as it is.
template <int N>
inline void CoalesceDims(StridedIter<N>* it) {
  for (int d = 0; d < it->rank; ++d) {
    if (it->sizes[d] == 0) return;
  }
  int r = 0;
  for (int d = 0; d < it->rank; ++d) {
    if (it->sizes[d] == 1) continue;
    bool merge = r > 0;
    for (int t = 0; t < N && merge; ++t) {
      merge = it->strides[t][r - 1] == it->strides[t][d] * it->sizes[d];
    }
    if (merge) {
      it->sizes[r - 1] *= it->sizes[d];
      for (int t = 0; t < N; ++t) it->strides[t][r - 1] = it->strides[t][d];
    } else {
      it->sizes[r] = it->sizes[d];
      for (int t = 0; t < N; ++t) it->strides[t][r] = it->strides[t][d];
      ++r;
    }
  }
  it->rank = r;
}

// ---- Binary and unary element math.

enum BinaryKind : int {
  kBinaryAdd = 0,
  kBinarySub = 1,
  kBinaryMul = 2,
  kBinaryDiv = 3,
};

// a op b, rounded once.
FSDP_HD inline float BinaryOp(int kind, float a, float b) {
  switch (kind) {
    case kBinaryAdd:
      return Add(a, b);
    case kBinarySub:
      return Add(a, -b);
    case kBinaryMul:
      return a * b;
    default:
      return a / b;
  }
}

enum UnaryKind : int {
  kUnaryAddScalar = 0,  // x + c
  kUnaryMulScalar = 1,  // x * c
  kUnarySilu = 2,       // x sigmoid(x), SwiGLU's body with b = 1
  kUnaryTanh = 3,       // FastTanh(x) (kernels/math.h)
  kUnarySoftplus = 4,   // log(1 + e^x) (kernels/elementwise.h)
};

// The unary op `kind` of x (c: the scalar of kUnaryAddScalar and kUnaryMulScalar).
FSDP_HD inline float UnaryOp(int kind, float x, float c) {
  switch (kind) {
    case kUnaryAddScalar:
      return Add(x, c);
    case kUnaryMulScalar:
      return x * c;
    case kUnarySilu:
      return SiluMulForward(x, 1.0f);
    case kUnarySoftplus:
      return SoftplusForward(x);
    default:
      return FastTanh(x);
  }
}

// dL/dx from g = dL/dy for the ops whose derivative is not a scalar op: kUnarySilu and
// kUnarySoftplus from v = their input x, kUnaryTanh from v = its output y (g (1 - y^2)).
FSDP_HD inline float UnaryGrad(int kind, float v, float g) {
  if (kind == kUnarySilu) return SiluMulGradGate(v, 1.0f, g);
  if (kind == kUnarySoftplus) return SoftplusGrad(v, g);
  return g * (1.0f - v * v);
}

// ---- Sums. NOTE [Sum order]: each output's sum of R terms (term k at a strided offset)
// is split into chunks of kSumChunk consecutive terms. In a chunk, lane l of kSumLanes adds
// the terms begin + l, begin + l + kSumLanes, ... in order, in double; the lanes are then
// added in lane order. The chunks' sums are added in chunk order (double), scaled and
// rounded to fp32 once. The order depends on R alone: the CPU (32 lanes of doubles, one
// chunk per task) and CUDA (a warp per chunk) give the same bits, for any thread count.

constexpr int kSumLanes = 32;
constexpr int64_t kSumChunk = 4096;

// Chunks of an R-term sum (at least 1).
FSDP_HD inline int64_t SumChunks(int64_t R) {
  return R <= kSumChunk ? 1 : (R + kSumChunk - 1) / kSumChunk;
}

// The offset of term k: a single strided dim needs no division.
FSDP_HD inline int64_t TermOffset(const StridedIter<1>& terms, int64_t k) {
  if (terms.rank <= 1) return terms.rank == 0 ? 0 : k * terms.strides[0][0];
  int64_t off;
  StridedOffsets(terms, k, &off);
  return off;
}

// Lane `lane`'s sum over the terms [begin, end) of x + base.
FSDP_HD inline double SumLane(const float* x, int64_t base, const StridedIter<1>& terms,
                              int64_t begin, int64_t end, int lane) {
  double acc = 0.0;
  for (int64_t k = begin + lane; k < end; k += kSumLanes) acc += x[base + TermOffset(terms, k)];
  return acc;
}

// The lanes' sums added in lane order.
FSDP_HD inline double CombineLanes(const double* lanes) {
  double s = lanes[0];
  for (int l = 1; l < kSumLanes; ++l) s += lanes[l];
  return s;
}

// ---- Maxima along a dim.

// The first maximal element of the K elements x[base + k * stride]: its value and k. NaN
// counts as above every number (the first NaN wins), as torch.max propagates NaN.
FSDP_HD inline void MaxAlong(const float* x, int64_t base, int64_t stride, int64_t K, float* value,
                             int32_t* index) {
  float best = x[base];
  int64_t at = 0;
  for (int64_t k = 1; k < K; ++k) {
    const float v = x[base + k * stride];
    if (v > best || (v != v && best == best)) {
      best = v;
      at = k;
    }
  }
  *value = best;
  *index = static_cast<int32_t>(at);
}

// ---- Gather and scatter along a dim (torch.gather, torch.scatter_add, index_select).
// NOTE [Gather and scatter]: an op walks an index shape `sizes` (rank dims; the index
// tensor's shape, or for index_select the data's shape with `dim` resized to the 1-D
// index's length, the index then strided 0 along the other dims). Element i reads the
// index value v at index_strides; its data element is the data tensor (contiguous, shape
// data_sizes) at i's coordinates with coordinate `dim` replaced by v; its other element
// (gather: the output written, scatter: the source read) is at other_strides. Values
// outside [0, data_sizes[dim]) are skipped (the CPU ops check them first).

struct GatherScatter {
  int rank = 0;
  int dim = 0;
  int64_t sizes[kMaxTensorRank] = {};
  int64_t data_sizes[kMaxTensorRank] = {};
  int64_t index_strides[kMaxTensorRank] = {};
  int64_t other_strides[kMaxTensorRank] = {};
};

FSDP_HD inline int64_t GatherScatterSize(const GatherScatter& g) {
  int64_t n = 1;
  for (int d = 0; d < g.rank; ++d) n *= g.sizes[d];
  return n;
}

// Element i's index offset, other offset, and data offset without dim's term; the data
// stride of `dim` goes to *dim_stride.
FSDP_HD inline void GatherScatterOffsets(const GatherScatter& g, int64_t i, int64_t* index_off,
                                         int64_t* other_off, int64_t* data_off,
                                         int64_t* dim_stride) {
  *index_off = 0;
  *other_off = 0;
  *data_off = 0;
  *dim_stride = 0;
  int64_t data_stride = 1;
  for (int d = g.rank - 1; d >= 0; --d) {
    const int64_t q = i / g.sizes[d];
    const int64_t c = i - q * g.sizes[d];
    *index_off += c * g.index_strides[d];
    *other_off += c * g.other_strides[d];
    if (d == g.dim) {
      *dim_stride = data_stride;
    } else {
      *data_off += c * data_stride;
    }
    data_stride *= g.data_sizes[d];
    i = q;
  }
}

FSDP_HD inline bool IndexInRange(int32_t v, int64_t size) { return v >= 0 && v < size; }

// Gather's element i: data[...] at the index value (0 for a value out of range), and the
// output offset it goes to in *out_off.
FSDP_HD inline float GatherAt(const GatherScatter& g, const float* data, const int32_t* index,
                              int64_t i, int64_t* out_off) {
  int64_t index_off, data_off, dim_stride;
  GatherScatterOffsets(g, i, &index_off, out_off, &data_off, &dim_stride);
  const int32_t v = index[index_off];
  return IndexInRange(v, g.data_sizes[g.dim]) ? data[data_off + v * dim_stride] : 0.0f;
}

// Scatter-add's data element e (flat, contiguous): `acc` (its value before) plus every
// source element whose index points at it, added in index-shape order (along dim, in
// order). The CPU's loop over the index shape in order adds the same terms in the same
// order, so both give these bits.
FSDP_HD inline float ScatterSumAt(const GatherScatter& g, const float* src, const int32_t* index,
                                  int64_t e, float acc) {
  int64_t index_base = 0, src_base = 0, target = 0;
  for (int d = g.rank - 1; d >= 0; --d) {
    const int64_t q = e / g.data_sizes[d];
    const int64_t c = e - q * g.data_sizes[d];
    if (d == g.dim) {
      target = c;
    } else {
      if (c >= g.sizes[d]) return acc;  // no index element has these coordinates
      index_base += c * g.index_strides[d];
      src_base += c * g.other_strides[d];
    }
    e = q;
  }
  for (int64_t p = 0; p < g.sizes[g.dim]; ++p) {
    if (index[index_base + p * g.index_strides[g.dim]] == target) {
      acc = Add(acc, src[src_base + p * g.other_strides[g.dim]]);
    }
  }
  return acc;
}

}  // namespace kernels

#endif  // KERNELS_TENSOR_H_
