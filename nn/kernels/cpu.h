// CPU-only helpers for the loops that run the nn/kernels bodies on the host (nn/tensor_ops.cc,
// optim/): run-time ISA dispatch by GCC function multiversioning, so one generic x86-64
// binary runs an AVX2+FMA (x86-64-v3) build of each hot loop on CPUs that have it and the
// baseline (SSE2) build elsewhere. Not for nvcc: CUDA code never includes this header.
//
//   FSDP_CPU_CLONES void GeluLoop(const float* FSDP_RESTRICT x, float* FSDP_RESTRICT y,
//                                 int64_t n) {
//   #pragma omp simd
//     for (int64_t i = 0; i < n; ++i) y[i] = nn::kernels::GeluTanhForward(x[i]);
//   }
//
// Rules for a loop marked FSDP_CPU_CLONES (checked by nn/kernels_test.cc and
// nn/tensor_ops_test.cc): its target is compiled with -fopenmp-simd -fno-trapping-math
// -fno-math-errno -ffp-contract=off, so the clones vectorise (selects instead of branches, no
// libm calls) and every clone computes each element bit for bit like the scalar body (no
// FMA contraction); only reductions (row sums) may differ between clones, by rounding.
#ifndef NN_KERNELS_CPU_H_
#define NN_KERNELS_CPU_H_

#if defined(__CUDACC__)
#error "nn/kernels/cpu.h is for host-compiled CPU loops only"
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

#endif  // NN_KERNELS_CPU_H_
