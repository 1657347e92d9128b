// What the CPU loops of kernels/, nn/ and optim/ run with: the process's intra-op thread
// count (which nn's oneDNN GEMMs use too) and the instruction set their FSDP_CPU_CLONES
// clones (kernels/cpu.h) picked on this CPU. Any build, any compiler flags.
//
//   RETURN_IF_ERROR(kernels::SetIntraOpThreads(2));  // loops and GEMMs use 2 threads
//   kernels::ParallelChunks(kernels::IntraOpThreads(), n, n, 16, f);
//   std::printf("%s\n", kernels::CpuLoopIsa());      // "x86-64-v3" on an AVX2 CPU
#ifndef KERNELS_CPU_RUNTIME_H_
#define KERNELS_CPU_RUNTIME_H_

#include "absl/status/status.h"

namespace kernels {

// Sets the number of threads every later CPU loop of kernels/, nn/ and optim/ (and nn's
// GEMMs, nn/ops.h) runs on, on any thread of the process, and calls omp_set_num_threads(n)
// for the calling thread. n must be >= 1, else InvalidArgument naming the value (and
// nothing changes). Thread-safe.
absl::Status SetIntraOpThreads(int n);

// The count SetIntraOpThreads last set; before any call, OMP_NUM_THREADS when the
// environment sets it (comm's local launcher sets it to hardware threads / ranks for each
// rank it starts), else 1. Never OpenMP's all-cores default by itself: several ranks on
// one host would each start a team, and idle OpenMP threads spin (measured: 2 ranks x 2
// threads on 2 cores ran a GPT step 2.2x slower). Always >= 1.
int IntraOpThreads();

// The instruction set of the FSDP_CPU_CLONES clones picked for this CPU at load time:
// "x86-64-v3" (AVX2 + FMA, 8 floats per operation) or "default" (the baseline x86-64
// build: SSE2, or any build that is not GCC on x86-64 Linux).
const char* CpuLoopIsa();

}  // namespace kernels

#endif  // KERNELS_CPU_RUNTIME_H_
