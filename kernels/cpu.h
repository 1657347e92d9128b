// CPU-only helpers for the loops that run the kernels/ bodies on the host (the CPU
// launchers in kernels/cpu/kernels.cc and kernels/optim_step.cc): run-time ISA dispatch
// by GCC function multiversioning, so one generic x86-64 binary runs an AVX2+FMA
// (x86-64-v3) build of each hot loop on CPUs that have it and the baseline (SSE2) build
// elsewhere, row sums in a fixed lane order, and OpenMP chunks over the intra-op threads
// (kernels/cpu_runtime.h). Not for nvcc: CUDA code never includes this header.
//
//   FSDP_CPU_CLONES void GeluLoop(const float* FSDP_RESTRICT x, float* FSDP_RESTRICT y,
//                                 int64_t n) {
//   #pragma omp simd
//     for (int64_t i = 0; i < n; ++i) y[i] = kernels::GeluTanhForward(x[i]);
//   }
//
// Rules for a loop marked FSDP_CPU_CLONES (checked by kernels/kernels_test.cc and
// kernels/cpu/kernels_test.cc): its target is compiled with -fopenmp (or -fopenmp-simd)
// -fno-trapping-math -fno-math-errno -ffp-contract=off, so the clones vectorise (selects
// instead of branches, no libm calls) and every clone computes each element bit for bit
// like the scalar body (no FMA contraction). Row sums go through LaneSum (below), whose
// fixed lane order gives the same bits in every clone and at every optimisation level.
// Launchers split independent rows or elements over threads with ParallelChunks (below),
// outside the clones (GCC outlines an OpenMP region before it makes the clones).
#ifndef KERNELS_CPU_H_
#define KERNELS_CPU_H_

#if defined(__CUDACC__)
#error "kernels/cpu.h is for host-compiled CPU loops only"
#endif

#include <stdint.h>

#if defined(_OPENMP)
#include <omp.h>
#endif

// GCC on x86-64 Linux (ifunc): an x86-64-v3 clone and the default one, picked once at load
// time by the CPU's features. Elsewhere (clang's fuzz builds, other architectures): one
// plain function.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define FSDP_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#define FSDP_CPU_HAS_CLONES 1
#else
#define FSDP_CPU_CLONES
#define FSDP_CPU_HAS_CLONES 0
#endif

// Inlined into every clone that calls it (so the clone's ISA applies to its body).
#if defined(__GNUC__)
#define FSDP_CPU_INLINE inline __attribute__((always_inline))
#define FSDP_RESTRICT __restrict__
#else
#define FSDP_CPU_INLINE inline
#define FSDP_RESTRICT
#endif

namespace kernels {

// ---- LaneSum: sum of f(j) for j in [0, n) in kLanes accumulators of type T: lane l adds
// the terms j = l, l + kLanes, ... in order, and the lanes are combined pairwise at the end.
// The order is fixed by the code, not by the vectoriser, so every clone (AVX2: one
// register of lanes; SSE2: two; unvectorised, e.g. -O1 under the sanitizers) gives the
// same bits, on any CPU. 8 lanes of float or 4 of double fill one AVX2 register.
template <typename T, typename F>
FSDP_CPU_INLINE T LaneSum(int64_t n, F f) {
  constexpr int kLanes = sizeof(T) == 4 ? 8 : 4;
  T acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = T(0);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) acc[l] += f(j + l);
  }
  for (int l = 0; j + l < n; ++l) acc[l] += f(j + l);
  if constexpr (kLanes == 8) {
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
  } else {
    return (acc[0] + acc[2]) + (acc[1] + acc[3]);
  }
}

// ---- Parallel chunks: independent rows or elements split over an OpenMP team.

// Below this many elements touched a call stays on the calling thread (a team costs a few
// microseconds to start).
constexpr int64_t kParallelMinWork = int64_t{1} << 16;

// Calls f(begin, end) on contiguous chunks that cover [0, n) exactly once: one chunk per
// thread of an OpenMP team of up to `threads` threads (IntraOpThreads(),
// kernels/cpu_runtime.h) when `work` (elements touched) >= kParallelMinWork and the target
// is built with -fopenmp, else f(0, n) on the caller. Chunk bounds are multiples of `align`
// (besides n). A caller whose units (rows, columns, elements) are independent gets bit-identical
// results for any thread count. f must not throw.
template <typename F>
inline void ParallelChunks(int threads, int64_t n, int64_t work, int64_t align, const F& f) {
#if defined(_OPENMP)
  const int64_t units = (n + align - 1) / align;
  if (threads > 1 && work >= kParallelMinWork && units > 1) {
    const int team = static_cast<int>(units < threads ? units : threads);
#pragma omp parallel num_threads(team)
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      const int64_t b = units * t / nt * align, e = units * (t + 1) / nt * align;
      const int64_t begin = b < n ? b : n, end = e < n ? e : n;
      if (begin < end) f(begin, end);
    }
    return;
  }
#else
  (void)threads;
  (void)work;
  (void)align;
#endif
  f(int64_t{0}, n);
}

}  // namespace kernels

#endif  // KERNELS_CPU_H_
