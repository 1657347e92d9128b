// Tests of the optimizer-step routing: CPU segments are updated by Add, element for
// element as the scalar bodies compute them, and a CUDA segment in a build without CUDA is
// refused naming the optimizer, the parameter and the device.
#include "kernels/optim_step.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/cuda_device.h"
#include "core/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_runtime.h"
#include "kernels/optim.h"

namespace kernels {
namespace {

using ::testing::HasSubstr;

TEST(OptimizerStepTest, CpuSegmentsMatchTheScalarBodiesOnAnyThreadCount) {
  const int64_t n = 100003;  // long enough for a team, not a multiple of a vector width
  std::vector<float> w0(n), g(n);
  for (int64_t i = 0; i < n; ++i) {
    w0[i] = std::sin(0.37f * i);
    g[i] = std::cos(0.91f * i);
  }
  const AdamWScalars as = MakeAdamWScalars(0.01, 0.9, 0.999, 1e-8, 0.1, 2);
  SgdScalars ss;
  ss.lr = 0.1f;
  ss.momentum = 0.9f;
  ss.use_momentum = true;
  ss.one_minus_dampening = 1.0f;
  ss.first_step = true;
  std::vector<float> aw = w0, am(n, 0.5f), av(n, 0.25f), sw = w0, sb(n, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    AdamWUpdate(&aw[i], &am[i], &av[i], g[i], as);
    SgdUpdate(&sw[i], &sb[i], g[i], ss);
  }
  const int saved = IntraOpThreads();
  for (int threads : {1, 3}) {
    ASSERT_TRUE(SetIntraOpThreads(threads).ok());
    std::vector<float> w = w0, m(n, 0.5f), v(n, 0.25f), w2 = w0, buf(n, 0.0f);
    OptimizerStep step("test");
    AdamWSegment a;
    a.w = w.data();
    a.g = g.data();
    a.m = m.data();
    a.v = v.data();
    a.n = n;
    a.s = as;
    SgdSegment s;
    s.w = w2.data();
    s.g = g.data();
    s.buf = buf.data();
    s.n = n;
    s.s = ss;
    ASSERT_TRUE(step.Add(core::Device::Cpu(), "a", a).ok());
    ASSERT_TRUE(step.Add(core::Device::Cpu(), "s", s).ok());
    // CPU segments are done when Add returns.
    EXPECT_EQ(w, aw) << threads << " threads";
    EXPECT_EQ(m, am) << threads << " threads";
    EXPECT_EQ(v, av) << threads << " threads";
    EXPECT_EQ(w2, sw) << threads << " threads";
    EXPECT_EQ(buf, sb) << threads << " threads";
    EXPECT_TRUE(step.Finish().ok());
  }
  ASSERT_TRUE(SetIntraOpThreads(saved).ok());
}

TEST(OptimizerStepTest, CudaSegmentInACpuBuildNamesTheOptimizerAndTheParameter) {
  if (core::BuiltWithCuda()) GTEST_SKIP() << "built with CUDA: CUDA segments are queued";
  float w = 1.0f, g = 1.0f, m = 0.0f, v = 0.0f;
  AdamWSegment a;
  a.w = &w;
  a.g = &g;
  a.m = &m;
  a.v = &v;
  a.n = 1;
  OptimizerStep step("AdamW");
  const absl::Status s = step.Add(core::Device::Cuda(0), "h.0.mlp.fc.weight", a);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("AdamW: parameter 'h.0.mlp.fc.weight' is on cuda:0 but this build has "
                        "no CUDA support"));
  EXPECT_EQ(w, 1.0f) << "a refused segment is not updated";
  SgdSegment sg;
  sg.w = &w;
  sg.g = &g;
  sg.n = 1;
  OptimizerStep sgd("SGD");
  EXPECT_THAT(std::string(sgd.Add(core::Device::Cuda(1), "bias", sg).message()),
              HasSubstr("SGD: parameter 'bias' is on cuda:1"));
  EXPECT_TRUE(step.Finish().ok());
}

}  // namespace
}  // namespace kernels
