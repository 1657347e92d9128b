// CPU launchers of kernels/tensor.h; see kernels/cpu/tensor_kernels.h. Compiled with
// CPU_LOOP_COPTS (kernels/cpu_loops.bzl): the rules of kernels/cpu.h.
#include "kernels/cpu/tensor_kernels.h"

#include <stdint.h>
#include <string.h>

#include "kernels/cpu.h"
#include "kernels/cpu_runtime.h"
#include "kernels/tensor.h"

namespace kernels {
namespace cpu {
namespace {

namespace k = ::kernels;

constexpr int64_t kAlign = 16;

// ---- Binary: a row of n outputs from a and b stepping sa and sb (0: one broadcast value).
// One clone per kind, with the contiguous and broadcast cases as their own loops so they
// vectorise.
#define FSDP_BINARY_ROW(Name, Kind)                                                               \
  FSDP_CPU_CLONES void Name(const float* a, int64_t sa, const float* b, int64_t sb,               \
                            float* FSDP_RESTRICT out, int64_t n) {                                \
    if (sa == 1 && sb == 1) {                                                                     \
      _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) out[i] = k::BinaryOp(Kind, a[i], b[i]); \
    } else if (sa == 1 && sb == 0) {                                                              \
      const float bv = b[0];                                                                      \
      _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) out[i] = k::BinaryOp(Kind, a[i], bv);   \
    } else if (sa == 0 && sb == 1) {                                                              \
      const float av = a[0];                                                                      \
      _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) out[i] = k::BinaryOp(Kind, av, b[i]);   \
    } else {                                                                                      \
      for (int64_t i = 0; i < n; ++i) out[i] = k::BinaryOp(Kind, a[i * sa], b[i * sb]);           \
    }                                                                                             \
  }
FSDP_BINARY_ROW(AddRow, k::kBinaryAdd)
FSDP_BINARY_ROW(SubRow, k::kBinarySub)
FSDP_BINARY_ROW(MulRow, k::kBinaryMul)
FSDP_BINARY_ROW(DivRow, k::kBinaryDiv)
#undef FSDP_BINARY_ROW

using BinaryRowFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t);

BinaryRowFn BinaryRowFor(int kind) {
  switch (kind) {
    case k::kBinaryAdd:
      return AddRow;
    case k::kBinarySub:
      return SubRow;
    case k::kBinaryMul:
      return MulRow;
    default:
      return DivRow;
  }
}

// ---- Unary, one clone per kind.
#define FSDP_UNARY_LOOP(Name, Kind)                                                       \
  FSDP_CPU_CLONES void Name(const float* x, float* y, int64_t n, float c) {               \
    _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) y[i] = k::UnaryOp(Kind, x[i], c); \
  }
FSDP_UNARY_LOOP(AddScalarLoop, k::kUnaryAddScalar)
FSDP_UNARY_LOOP(MulScalarLoop, k::kUnaryMulScalar)
FSDP_UNARY_LOOP(SiluLoop, k::kUnarySilu)
FSDP_UNARY_LOOP(TanhLoop, k::kUnaryTanh)
FSDP_UNARY_LOOP(SoftplusLoop, k::kUnarySoftplus)
#undef FSDP_UNARY_LOOP

using UnaryFn = void (*)(const float*, float*, int64_t, float);

UnaryFn UnaryFor(int kind) {
  switch (kind) {
    case k::kUnaryAddScalar:
      return AddScalarLoop;
    case k::kUnaryMulScalar:
      return MulScalarLoop;
    case k::kUnarySilu:
      return SiluLoop;
    case k::kUnarySoftplus:
      return SoftplusLoop;
    default:
      return TanhLoop;
  }
}

FSDP_CPU_CLONES void SiluGradLoop(const float* FSDP_RESTRICT x, const float* FSDP_RESTRICT g,
                                  float* FSDP_RESTRICT gx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) gx[i] = k::UnaryGrad(k::kUnarySilu, x[i], g[i]);
}

FSDP_CPU_CLONES void SoftplusGradLoop(const float* FSDP_RESTRICT x, const float* FSDP_RESTRICT g,
                                      float* FSDP_RESTRICT gx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) gx[i] = k::UnaryGrad(k::kUnarySoftplus, x[i], g[i]);
}

FSDP_CPU_CLONES void TanhGradLoop(const float* FSDP_RESTRICT y, const float* FSDP_RESTRICT g,
                                  float* FSDP_RESTRICT gx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) gx[i] = k::UnaryGrad(k::kUnaryTanh, y[i], g[i]);
}

// ---- Rows of a strided iteration: the innermost dim is walked by a plain loop, the
// others by StridedOffsets once per row.

// Calls row(first element, offsets of the row's first element, row length) for every row
// of `it`, rows split over the intra-op threads (work: elements touched).
template <int N, typename F>
void ForEachRow(const StridedIter<N>& it, const F& row) {
  const int64_t n = IterSize(it);
  if (n == 0) return;
  if (it.rank <= 1) {  // one row: split its elements
    ParallelChunks(IntraOpThreads(), n, n, kAlign, [&](int64_t b, int64_t e) {
      int64_t off[N];
      for (int t = 0; t < N; ++t) off[t] = it.rank == 0 ? 0 : b * it.strides[t][0];
      row(b, off, e - b);
    });
    return;
  }
  const int64_t inner = it.sizes[it.rank - 1];
  ParallelChunks(IntraOpThreads(), n / inner, n, 1, [&](int64_t b, int64_t e) {
    int64_t off[N];
    for (int64_t r = b; r < e; ++r) {
      StridedOffsets(it, r * inner, off);
      row(r * inner, off, inner);
    }
  });
}

// The stride of operand t along the innermost dim (0 for rank 0).
template <int N>
int64_t InnerStride(const StridedIter<N>& it, int t) {
  return it.rank == 0 ? 0 : it.strides[t][it.rank - 1];
}

FSDP_CPU_CLONES void CopyRow(const uint32_t* FSDP_RESTRICT src, int64_t ss,
                             uint32_t* FSDP_RESTRICT dst, int64_t sd, int64_t n) {
  if (ss == 1 && sd == 1) {
    memcpy(dst, src, static_cast<size_t>(n) * sizeof(uint32_t));
    return;
  }
  for (int64_t i = 0; i < n; ++i) dst[i * sd] = src[i * ss];
}

FSDP_CPU_CLONES void ExpandScaledRow(const float* FSDP_RESTRICT x, int64_t sx,
                                     float* FSDP_RESTRICT out, int64_t n, float scale) {
  if (sx == 0) {
    const float v = x[0] * scale;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = v;
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = x[i * sx] * scale;
  }
}

// NOTE [Sum order]: the sum of the terms [begin, end) of x + base, in kSumLanes lanes of
// doubles (lane l: the terms begin + l + m kSumLanes, in order) added in lane order.
FSDP_CPU_CLONES double SumChunk(const float* FSDP_RESTRICT x, int64_t base, StridedIter<1> terms,
                                int64_t begin, int64_t end) {
  double lanes[k::kSumLanes];
  for (int l = 0; l < k::kSumLanes; ++l) lanes[l] = 0.0;
  int64_t j = begin;
  if (terms.rank <= 1) {  // one strided dim: the offsets need no division
    const int64_t s = terms.rank == 0 ? 0 : terms.strides[0][0];
    const float* p = x + base;
    for (; j + k::kSumLanes <= end; j += k::kSumLanes) {
#pragma omp simd
      for (int l = 0; l < k::kSumLanes; ++l) lanes[l] += p[(j + l) * s];
    }
    for (int l = 0; j + l < end; ++l) lanes[l] += p[(j + l) * s];
  } else {
    for (; j + k::kSumLanes <= end; j += k::kSumLanes) {
      for (int l = 0; l < k::kSumLanes; ++l) lanes[l] += x[base + k::TermOffset(terms, j + l)];
    }
    for (int l = 0; j + l < end; ++l) lanes[l] += x[base + k::TermOffset(terms, j + l)];
  }
  return k::CombineLanes(lanes);
}

int64_t OuterOffset(const StridedIter<1>& outer, int64_t j) {
  int64_t off;
  StridedOffsets(outer, j, &off);
  return off;
}

}  // namespace

void Binary(int kind, const float* a, const float* b, float* out, StridedIter<2> it) {
  const BinaryRowFn row = BinaryRowFor(kind);
  const int64_t sa = InnerStride(it, 0), sb = InnerStride(it, 1);
  ForEachRow(it, [&](int64_t first, const int64_t* off, int64_t n) {
    row(a + off[0], sa, b + off[1], sb, out + first, n);
  });
}

void Unary(int kind, const float* x, float* y, int64_t n, float c) {
  const UnaryFn loop = UnaryFor(kind);
  ParallelChunks(IntraOpThreads(), n, n, kAlign,
                 [&](int64_t b, int64_t e) { loop(x + b, y + b, e - b, c); });
}

void UnaryGrad(int kind, const float* v, const float* g, float* gx, int64_t n) {
  ParallelChunks(IntraOpThreads(), n, n, kAlign, [&](int64_t b, int64_t e) {
    if (kind == k::kUnarySilu) {
      SiluGradLoop(v + b, g + b, gx + b, e - b);
    } else if (kind == k::kUnarySoftplus) {
      SoftplusGradLoop(v + b, g + b, gx + b, e - b);
    } else {
      TanhGradLoop(v + b, g + b, gx + b, e - b);
    }
  });
}

void StridedCopy(const void* src, void* dst, StridedIter<2> it) {
  const uint32_t* s = static_cast<const uint32_t*>(src);
  uint32_t* d = static_cast<uint32_t*>(dst);
  const int64_t ss = InnerStride(it, 0), sd = InnerStride(it, 1);
  ForEachRow(it, [&](int64_t, const int64_t* off, int64_t n) {
    CopyRow(s + off[0], ss, d + off[1], sd, n);
  });
}

void ExpandScaled(const float* x, float* out, StridedIter<1> it, float scale) {
  const int64_t sx = InnerStride(it, 0);
  ForEachRow(it, [&](int64_t first, const int64_t* off, int64_t n) {
    ExpandScaledRow(x + off[0], sx, out + first, n, scale);
  });
}

void Sum(const float* x, float* out, StridedIter<1> outer, StridedIter<1> terms, double scale,
         double* scratch) {
  const int64_t J = IterSize(outer), R = IterSize(terms), C = k::SumChunks(R);
  // Tasks (j, c), independent: each writes its own chunk sum.
  ParallelChunks(IntraOpThreads(), J * C, J * R, 1, [&](int64_t b, int64_t e) {
    for (int64_t task = b; task < e; ++task) {
      const int64_t j = task / C, c = task - j * C;
      const int64_t begin = c * k::kSumChunk,
                    end = begin + k::kSumChunk < R ? begin + k::kSumChunk : R;
      const double s = SumChunk(x, OuterOffset(outer, j), terms, begin, end);
      if (C == 1) {
        out[j] = static_cast<float>(s * scale);
      } else {
        scratch[task] = s;
      }
    }
  });
  if (C == 1) return;
  for (int64_t j = 0; j < J; ++j) {
    double total = scratch[j * C];
    for (int64_t c = 1; c < C; ++c) total += scratch[j * C + c];
    out[j] = static_cast<float>(total * scale);
  }
}

void MaxAlongDim(const float* x, float* values, int32_t* indices, StridedIter<1> outer,
                 int64_t stride, int64_t K) {
  const int64_t J = IterSize(outer);
  ParallelChunks(IntraOpThreads(), J, J * K, 1, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      k::MaxAlong(x, OuterOffset(outer, j), stride, K, values + j, indices + j);
    }
  });
}

void Gather(const float* data, const int32_t* index, float* out, GatherScatter g) {
  const int64_t n = k::GatherScatterSize(g);
  ParallelChunks(IntraOpThreads(), n, n, kAlign, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int64_t out_off;
      const float v = k::GatherAt(g, data, index, i, &out_off);
      out[out_off] = v;
    }
  });
}

void ScatterAdd(const float* src, const int32_t* index, float* data, GatherScatter g) {
  // One thread, in index-shape order: the order ScatterSumAt adds in.
  const int64_t n = k::GatherScatterSize(g);
  const int64_t dim_size = g.data_sizes[g.dim];
  for (int64_t i = 0; i < n; ++i) {
    int64_t index_off, src_off, data_off, dim_stride;
    k::GatherScatterOffsets(g, i, &index_off, &src_off, &data_off, &dim_stride);
    const int32_t v = index[index_off];
    if (!k::IndexInRange(v, dim_size)) continue;
    float* d = data + data_off + v * dim_stride;
    *d = k::Add(*d, src[src_off]);
  }
}

}  // namespace cpu
}  // namespace kernels
