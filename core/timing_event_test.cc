#include "core/timing_event.h"

#include <string>

#include "core/cuda_device.h"
#include "gtest/gtest.h"

namespace core {
namespace {

TEST(TimingEventTest, ACpuDeviceHasNothingToTime) {
  const absl::StatusOr<void*> event = RecordTimingEvent(Device::Cpu(), "step 1");
  ASSERT_TRUE(event.ok()) << event.status();
  EXPECT_EQ(*event, nullptr);
  DestroyTimingEvent(*event);  // a no-op
}

TEST(TimingEventTest, AMissingEventIsInvalidArgumentNamingWhat) {
  const absl::StatusOr<double> ms = TimingEventMs(nullptr, nullptr, "step 1");
  EXPECT_EQ(ms.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(ms.status().message()).find("step 1"), std::string::npos) << ms.status();
}

// A build without CUDA refuses a CUDA device, naming --config=cuda; on a GPU two events
// around nothing are a non-negative time apart.
TEST(TimingEventTest, ACudaDeviceNeedsACudaBuildAndTimesOnTheGpu) {
  const absl::StatusOr<void*> start = RecordTimingEvent(Device::Cuda(0), "step 1");
  if (!BuiltWithCuda()) {
    EXPECT_EQ(start.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(std::string(start.status().message()).find("--config=cuda"), std::string::npos)
        << start.status();
    return;
  }
  const absl::StatusOr<int> gpus = CudaDeviceCount();
  if (!gpus.ok() || *gpus == 0) GTEST_SKIP() << "no usable CUDA device: " << gpus.status();
  ASSERT_TRUE(start.ok()) << start.status();
  const absl::StatusOr<void*> end = RecordTimingEvent(Device::Cuda(0), "step 1");
  ASSERT_TRUE(end.ok()) << end.status();
  const absl::StatusOr<double> ms = TimingEventMs(*start, *end, "step 1");
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GE(*ms, 0.0);
  DestroyTimingEvent(*start);
  DestroyTimingEvent(*end);
}

}  // namespace
}  // namespace core
