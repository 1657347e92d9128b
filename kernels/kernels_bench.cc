// Microbenchmark of the CPU optimizer update (kernels/optim_step.h): elements per second
// of AdamW over one rank's flat shard of the 4.9M-parameter GPT (2 ranks), the scalar loop
// as it was before FSDP_CPU_CLONES ("before": compiled for baseline x86-64 with
// -fopenmp-simd) against kernels::AdamWOnCpu, the launcher every optimizer's CPU step runs
// ("after"), timed by kernels/testing/bench.h. The element and row kernels of the layers
// are benchmarked by //nn:kernels_bench. Prints one JSON object.
//
//   bazel run -c opt //kernels:kernels_bench
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/optim.h"
#include "kernels/optim_step.h"
#include "kernels/testing/bench.h"

namespace {

using ::kernels::bench::Measure;
using ::kernels::bench::Normal;
using ::kernels::bench::P;
using ::kernels::bench::Result;

// The loop before FSDP_CPU_CLONES.
void OldAdamW(float* w, float* m, float* v, const float* g, int64_t n,
              const kernels::AdamWScalars& s) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) kernels::AdamWUpdate(&w[j], &m[j], &v[j], g[j], s);
}

}  // namespace

int main() {
  std::vector<Result> results;
  {  // AdamW over one rank's flat shard of the 4.9M-parameter model (2 ranks).
    const int64_t n = 4902912 / 2;
    core::Tensor w = Normal(n, 11), g = Normal(n, 12);
    core::Tensor m = core::Tensor::Zeros({n}), v = core::Tensor::Zeros({n});
    const kernels::AdamWScalars s = kernels::MakeAdamWScalars(1e-3, 0.9, 0.999, 1e-8, 0.01, 3);
    core::Tensor w2 = Normal(n, 11), g2 = Normal(n, 12);
    core::Tensor m2 = core::Tensor::Zeros({n}), v2 = core::Tensor::Zeros({n});
    kernels::AdamWSegment seg;
    seg.w = P(w2);
    seg.g = P(g2);
    seg.m = P(m2);
    seg.v = P(v2);
    seg.n = n;
    seg.s = s;
    results.push_back(Measure(
        "adamw", n, [&] { OldAdamW(P(w), P(m), P(v), P(g), n, s); },
        [&] { kernels::AdamWOnCpu(seg); }));
  }
  kernels::bench::PrintJson(results);
  return 0;
}
