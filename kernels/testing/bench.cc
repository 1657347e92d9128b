#include "kernels/testing/bench.h"

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "core/random.h"
#include "kernels/cpu_runtime.h"

namespace kernels {
namespace bench {
namespace {

double ThreadSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

double WallSeconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// Best per-call seconds of fn (by `clock`) over 5 repetitions of >= 50 ms each.
double TimeBy(double (*clock)(), const std::function<void()>& fn) {
  fn();  // warm up (page faults, caches)
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    int calls = 0;
    const double t0 = clock();
    double t = t0;
    do {
      fn();
      ++calls;
      t = clock();
    } while (t - t0 < 0.05);
    best = std::min(best, (t - t0) / calls);
  }
  return best;
}

}  // namespace

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "kernels_bench: %s\n", std::string(s.message()).c_str());
    std::exit(1);
  }
}

double Time(const std::function<void()>& fn) {
  Check(SetIntraOpThreads(1));
  return TimeBy(&ThreadSeconds, fn);
}

double WallTime(int threads, const std::function<void()>& fn) {
  Check(SetIntraOpThreads(threads));
  const double t = TimeBy(&WallSeconds, fn);
  Check(SetIntraOpThreads(1));
  return t;
}

core::Tensor Normal(int64_t n, uint64_t seed, float scale) {
  core::Tensor t = core::Tensor::Empty({n});
  core::Rng rng(seed);
  float* p = t.data<float>();
  for (int64_t i = 0; i < n; ++i) p[i] = rng.Normal(0.0f, scale);
  return t;
}

Result Measure(const std::string& name, int64_t elements, const std::function<void()>& before,
               const std::function<void()>& after, double overhead_s, double wall_overhead_s) {
  Result r{name, elements, Time(before) - overhead_s, Time(after) - overhead_s};
  r.wall1_s = WallTime(1, after) - wall_overhead_s;
  r.wall2_s = WallTime(2, after) - wall_overhead_s;
  return r;
}

void PrintJson(const std::vector<Result>& results) {
  std::printf(
      "{\n  \"isa\": \"%s\",\n  \"config\": \"512 128 256 6 8 8\",\n"
      "  \"before_after_unit\": \"elements/s of thread CPU time on 1 thread, best of 5\",\n"
      "  \"wall_unit\": \"elements/s of wall time of the dispatched loops, best of 5\",\n"
      "  \"kernels\": [\n",
      CpuLoopIsa());
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::printf(
        "    {\"name\": \"%s\", \"elements\": %lld, \"before\": %.4g, \"after\": %.4g, "
        "\"speedup\": %.2f, \"wall_1_thread\": %.4g, \"wall_2_threads\": %.4g}%s\n",
        r.name.c_str(), static_cast<long long>(r.elements), r.elements / r.before_s,
        r.elements / r.after_s, r.before_s / r.after_s, r.elements / r.wall1_s,
        r.elements / r.wall2_s, i + 1 < results.size() ? "," : "");
  }
  std::printf("  ]\n}\n");
}

}  // namespace bench
}  // namespace kernels
