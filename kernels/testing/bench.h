// The timing harness of the CPU kernel micro-benchmarks (//kernels:kernels_bench,
// //nn:kernels_bench): each entry times a "before" loop against the dispatched "after"
// one by this thread's CPU time (CLOCK_THREAD_CPUTIME_ID, the best of 5 repetitions of
// >= 50 ms, on 1 thread, so other processes disturb it little), then the "after" one by
// wall time on 1 and 2 intra-op threads (kernels::SetIntraOpThreads); PrintJson writes
// one JSON object.
//
//   std::vector<kernels::bench::Result> results;
//   results.push_back(kernels::bench::Measure("adamw", n, [&] { Old(...); },
//                                             [&] { kernels::AdamWOnCpu(seg); }));
//   kernels::bench::PrintJson(results);
#ifndef KERNELS_TESTING_BENCH_H_
#define KERNELS_TESTING_BENCH_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/tensor.h"

namespace kernels {
namespace bench {

// Exits the benchmark with the status's message unless it is OK.
void Check(const absl::Status& s);

// Best per-call thread CPU seconds of fn on 1 intra-op thread.
double Time(const std::function<void()>& fn);

// Best per-call wall seconds of fn on `threads` intra-op threads.
double WallTime(int threads, const std::function<void()>& fn);

// An fp32 CPU tensor of n draws from N(0, scale^2) by core::Rng(seed), in element order.
core::Tensor Normal(int64_t n, uint64_t seed, float scale = 1.0f);

// The float elements of an fp32 tensor.
inline float* P(const core::Tensor& t) { return t.data<float>(); }

struct Result {
  std::string name;
  int64_t elements;
  double before_s, after_s;
  double wall1_s = 0, wall2_s = 0;
};

// Thread CPU time of before and after, then wall time of after on 1 and 2 threads; the
// overheads (e.g. restoring an input each call) are subtracted from each.
Result Measure(const std::string& name, int64_t elements, const std::function<void()>& before,
               const std::function<void()>& after, double overhead_s = 0,
               double wall_overhead_s = 0);

// Prints {"isa", "config", the units, "kernels": [one object per result]} to stdout.
void PrintJson(const std::vector<Result>& results);

}  // namespace bench
}  // namespace kernels

#endif  // KERNELS_TESTING_BENCH_H_
