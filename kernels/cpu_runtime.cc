#include "kernels/cpu_runtime.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "kernels/cpu.h"

namespace kernels {
namespace {

// The count SetIntraOpThreads set (0: never set).
std::atomic<int> g_intra_op_threads{0};

// Resolved by the same CPU-feature dispatch as the FSDP_CPU_CLONES loops.
#if FSDP_CPU_HAS_CLONES
__attribute__((target("default"))) const char* LoopIsa() { return "default"; }
__attribute__((target("arch=x86-64-v3"))) const char* LoopIsa() { return "x86-64-v3"; }
#else
const char* LoopIsa() { return "default"; }
#endif

}  // namespace

absl::Status SetIntraOpThreads(int n) {
  if (n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernels::SetIntraOpThreads: intra-op threads must be >= 1, got ", n));
  }
  g_intra_op_threads.store(n, std::memory_order_relaxed);
  omp_set_num_threads(n);
  return absl::OkStatus();
}

int IntraOpThreads() {
  const int set = g_intra_op_threads.load(std::memory_order_relaxed);
  if (set > 0) return set;
  static const bool kFromEnvironment = std::getenv("OMP_NUM_THREADS") != nullptr;
  if (kFromEnvironment) return std::max(1, omp_get_max_threads());
  return 1;
}

const char* CpuLoopIsa() { return LoopIsa(); }

}  // namespace kernels
