// Tests of the main job's device and backend choice (--device / --backend) with an
// injected availability, moving a model to a device, and the throughput figures.
#include "integration/device_setup.h"

#include <string>

#include "core/cuda_device.h"
#include "gtest/gtest.h"
#include "nn/linear.h"

namespace integration {
namespace {

DeviceAvailability Gpus(int n) {
  DeviceAvailability a;
  a.built_with_cuda = true;
  a.gpus = n;
  return a;
}

DeviceAvailability CpuBuild() {
  DeviceAvailability a;
  a.built_with_cuda = false;
  a.gpus = absl::UnavailableError("built without CUDA");
  return a;
}

TEST(ChooseDeviceTest, CpuTakesGlooAndAutoMeansGloo) {
  for (const char* backend : {"gloo", "auto"}) {
    auto c = ChooseDeviceAndBackend("cpu", backend, 0, CpuBuild());
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(c->device.is_cpu());
    EXPECT_EQ(c->backend, comm::Backend::kGloo);
  }
}

TEST(ChooseDeviceTest, CpuTakesShmWhenAskedFor) {
  auto c = ChooseDeviceAndBackend("cpu", "shm", 0, CpuBuild());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->device.is_cpu());
  EXPECT_EQ(c->backend, comm::Backend::kShm);
}

TEST(ChooseDeviceTest, CudaWithShmIsRefusedLikeGloo) {
  auto c = ChooseDeviceAndBackend("cuda", "shm", 0, Gpus(2));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
  EXPECT_NE(c.status().message().find("--backend=shm"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("host buffers"), std::string::npos) << c.status();
}

TEST(ChooseDeviceTest, CpuWithNcclIsRefused) {
  auto c = ChooseDeviceAndBackend("cpu", "nccl", 0, Gpus(8));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find("--backend=nccl"), std::string::npos) << c.status();
}

TEST(ChooseDeviceTest, CudaInABuildWithoutCudaSaysHowToBuild) {
  // Whatever the backend: the build is the first thing to fix.
  for (const char* backend : {"nccl", "auto", "gloo"}) {
    auto c = ChooseDeviceAndBackend("cuda", backend, 0, CpuBuild());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
    EXPECT_NE(c.status().message().find("--config=cuda"), std::string::npos) << c.status();
    EXPECT_NE(c.status().message().find("--device=cuda"), std::string::npos) << c.status();
  }
}

TEST(ChooseDeviceTest, CudaWithoutAGpuIsUnavailableWithTheReason) {
  DeviceAvailability a;
  a.built_with_cuda = true;
  a.gpus = absl::UnavailableError("cudaGetDeviceCount: no CUDA-capable device is detected");
  auto c = ChooseDeviceAndBackend("cuda", "auto", 0, a);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("no CUDA-capable device"), std::string::npos) << c.status();
  EXPECT_EQ(ChooseDeviceAndBackend("cuda", "nccl", 0, Gpus(0)).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(ChooseDeviceTest, CudaUsesTheLocalRanksGpuOverNccl) {
  for (const char* backend : {"nccl", "auto"}) {
    auto c = ChooseDeviceAndBackend("cuda", backend, 3, Gpus(4));
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->device, core::Device::Cuda(3));
    EXPECT_EQ(c->backend, comm::Backend::kNccl);
  }
  auto c = ChooseDeviceAndBackend("cuda", "nccl", 4, Gpus(4));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find("LOCAL_RANK 4"), std::string::npos) << c.status();
}

TEST(ChooseDeviceTest, CudaWithGlooAndUnknownNamesAreRefused) {
  EXPECT_EQ(ChooseDeviceAndBackend("cuda", "gloo", 0, Gpus(1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ChooseDeviceAndBackend("tpu", "auto", 0, Gpus(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChooseDeviceAndBackend("cpu", "mpi", 0, Gpus(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChooseDeviceTest, ThisBuildsProbeIsConsistent) {
  const DeviceAvailability a = DeviceAvailability::Probe();
  EXPECT_EQ(a.built_with_cuda, core::BuiltWithCuda());
  auto c = ChooseDeviceAndBackend("cuda", "auto", 0, a);
  if (!a.built_with_cuda) {
    EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  }
}

TEST(MoveModuleTest, KeepsTheParameterObjectsAndValues) {
  auto linear = std::make_shared<nn::Linear>(3, 2);
  const auto before = linear->Parameters();
  const std::vector<float> w = before[0]->data.ToVector();
  ASSERT_TRUE(MoveModuleToDevice(*linear, core::Device::Cpu()).ok());
  EXPECT_EQ(linear->Parameters(), before);
  EXPECT_EQ(linear->Parameters()[0]->data.ToVector(), w);
  absl::StatusOr<int> gpus = core::CudaDeviceCount();
  if (!gpus.ok() || *gpus == 0) return;  // the device half needs a GPU
  ASSERT_TRUE(MoveModuleToDevice(*linear, core::Device::Cuda(0)).ok());
  EXPECT_EQ(linear->Parameters(), before);
  EXPECT_TRUE(before[0]->data.device().is_cuda());
  core::Tensor back = core::Tensor::Zeros(before[0]->data.shape());
  ASSERT_TRUE(back.CopyFrom(before[0]->data).ok());
  EXPECT_EQ(back.ToVector(), w);
}

TEST(MoveModuleTest, ACudaMoveInACpuBuildNamesTheParameter) {
  if (core::BuiltWithCuda()) GTEST_SKIP() << "checks the CPU build's refusal";
  auto linear = std::make_shared<nn::Linear>(3, 2);
  absl::Status s = MoveModuleToDevice(*linear, core::Device::Cuda(0));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("weight"), std::string::npos) << s;
}

TEST(ThroughputTest, FlopsPerTokenOfGpt2Small) {
  // GPT-2 124M (V 50304, T 1024, C 768, L 12): 6 N + 12 L T C.
  const int64_t n = 124475904;
  EXPECT_DOUBLE_EQ(GptFlopsPerToken(n, 12, 1024, 768), 6.0 * n + 12.0 * 12 * 1024 * 768);
}

TEST(ThroughputTest, PeaksByName) {
  EXPECT_EQ(PeakBf16FlopsFromName("NVIDIA H200, 139.8 GiB, sm_90"), 989e12);
  EXPECT_EQ(PeakBf16FlopsFromName("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_EQ(PeakBf16FlopsFromName("Some GPU"), std::nullopt);
}

TEST(ThroughputTest, ExcludesTheWarmUpAndTheLastStepsTail) {
  ThroughputMeter meter(50);  // warm-up min(5, 50 / 10) = 5
  EXPECT_EQ(meter.warmup_steps(), 5);
  absl::Time t = absl::FromUnixSeconds(100);
  for (int step = 1; step <= 50; ++step) {
    meter.StepStarted(t);
    t += step <= 5 ? absl::Seconds(10) : absl::Seconds(1);  // slow warm-up steps
  }
  // Steps 6 .. 49 measured: 44 steps of 1 s.
  EXPECT_EQ(meter.measured_steps(), 44);
  EXPECT_DOUBLE_EQ(*meter.TokensPerSecond(1000), 1000.0);
  ThroughputMeter few(1);
  few.StepStarted(t);
  EXPECT_EQ(few.TokensPerSecond(1000), std::nullopt);
}

TEST(ThroughputTest, AGivenWarmUpReplacesTheDefault) {
  ThroughputMeter meter(50, /*warmup_steps=*/2);  // the default would be 5
  EXPECT_EQ(meter.warmup_steps(), 2);
  absl::Time t = absl::FromUnixSeconds(100);
  for (int step = 1; step <= 50; ++step) {
    meter.StepStarted(t);
    t += step <= 2 ? absl::Seconds(10) : absl::Seconds(2);
  }
  // Steps 3 .. 49 measured: 47 steps of 2 s.
  EXPECT_EQ(meter.measured_steps(), 47);
  EXPECT_DOUBLE_EQ(*meter.TokensPerSecond(1000), 500.0);
  ThroughputMeter none(50, /*warmup_steps=*/0);
  EXPECT_EQ(none.warmup_steps(), 0);
}

// The device timing is CUDA's: a CPU meter has no device figure, however many steps it saw.
TEST(ThroughputTest, ACpuMeterHasNoDeviceTimedFigure) {
  ThroughputMeter meter(20, std::nullopt, core::Device::Cpu());
  absl::Time t = absl::FromUnixSeconds(100);
  for (int step = 1; step <= 20; ++step, t += absl::Seconds(1)) meter.StepStarted(t);
  ASSERT_GT(meter.measured_steps(), 0);
  const absl::StatusOr<std::optional<DeviceStepTimes>> timed = meter.DeviceTimed(1000);
  ASSERT_TRUE(timed.ok()) << timed.status();
  EXPECT_EQ(*timed, std::nullopt);
}

TEST(ThroughputTest, DeviceStepFiguresAreTheMedianTheMeanAndTokensFromTheMean) {
  // Whatever the order: an even count's median is the mean of the two middle values, an
  // odd count's the middle one.
  std::optional<DeviceStepTimes> t = SummarizeDeviceSteps({30, 10, 20, 100}, 4000);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->steps, 4);
  EXPECT_DOUBLE_EQ(t->step_ms_median, 25.0);
  EXPECT_DOUBLE_EQ(t->step_ms_mean, 40.0);
  EXPECT_DOUBLE_EQ(t->tokens_per_second, 4000 * 1000.0 / 40.0);
  t = SummarizeDeviceSteps({50, 10, 20}, 1000);
  ASSERT_TRUE(t.has_value());
  EXPECT_DOUBLE_EQ(t->step_ms_median, 20.0);
  EXPECT_DOUBLE_EQ(t->step_ms_mean, 80.0 / 3);
  EXPECT_DOUBLE_EQ(t->tokens_per_second, 1000 * 1000.0 / (80.0 / 3));
  EXPECT_EQ(SummarizeDeviceSteps({}, 1000), std::nullopt);
  EXPECT_EQ(SummarizeDeviceSteps({0, 0}, 1000), std::nullopt);
}

}  // namespace
}  // namespace integration
