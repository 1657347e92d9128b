#include "core/host_memory.h"

#include <sys/stat.h>

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace core {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kKiB = 1024;

void Write(const std::string& path, const std::string& contents) {
  std::ofstream out(path);
  out << contents;
}

void MakeDirs(const std::string& path) {
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || (path[i] == '/' && i > 0)) ::mkdir(path.substr(0, i).c_str(), 0755);
  }
}

// A fake /proc and /sys/fs/cgroup under the test's temporary directory.
class HostMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = ::testing::TempDir() + "/" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    MakeDirs(root_ + "/cgroup");
    paths_.meminfo = root_ + "/meminfo";
    paths_.self_cgroup = root_ + "/self_cgroup";
    paths_.cgroup_root = root_ + "/cgroup";
    Write(paths_.meminfo,
          "MemTotal:       16000000 kB\nMemFree:         1000 kB\n"
          "MemAvailable:   12000000 kB\nSwapTotal:       2000000 kB\n");
  }
  std::string root_;
  HostMemoryPaths paths_;
};

TEST_F(HostMemoryTest, WithoutCgroupsAvailableIsMemAvailable) {
  absl::StatusOr<HostMemoryInfo> info = ReadHostMemoryInfo(paths_);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->mem_total, 16000000 * kKiB);
  EXPECT_EQ(info->mem_available, 12000000 * kKiB);
  EXPECT_EQ(info->swap_total, 2000000 * kKiB);
  EXPECT_FALSE(info->cgroup_limit.has_value());
  EXPECT_EQ(info->Available(), 12000000 * kKiB);
  EXPECT_EQ(info->Capacity(), 18000000 * kKiB);
}

TEST_F(HostMemoryTest, CgroupV2LimitOfAnAncestorCaps) {
  Write(paths_.self_cgroup, "0::/job/rank0\n");
  MakeDirs(paths_.cgroup_root + "/job/rank0");
  Write(paths_.cgroup_root + "/job/rank0/memory.max", "max\n");
  Write(paths_.cgroup_root + "/job/rank0/memory.current", "100\n");
  Write(paths_.cgroup_root + "/job/memory.max", "1073741824\n");
  Write(paths_.cgroup_root + "/job/memory.current", "268435456\n");
  absl::StatusOr<HostMemoryInfo> info = ReadHostMemoryInfo(paths_);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_TRUE(info->cgroup_limit.has_value());
  EXPECT_EQ(*info->cgroup_limit, int64_t{1} << 30);
  EXPECT_EQ(info->Available(), (int64_t{1} << 30) - (int64_t{1} << 28));
  EXPECT_EQ(info->Capacity(), int64_t{1} << 30);
  EXPECT_THAT(info->Describe(), HasSubstr("cgroup limit 1.00GiB"));
  EXPECT_THAT(info->Describe(), HasSubstr("/job/memory.max"));
}

TEST_F(HostMemoryTest, CgroupV1LimitAndUnlimitedSentinel) {
  Write(paths_.self_cgroup, "4:memory:/docker/abc\n3:cpu:/\n");
  MakeDirs(paths_.cgroup_root + "/memory/docker/abc");
  Write(paths_.cgroup_root + "/memory/memory.limit_in_bytes", "9223372036854771712\n");
  Write(paths_.cgroup_root + "/memory/docker/abc/memory.limit_in_bytes", "2147483648\n");
  Write(paths_.cgroup_root + "/memory/docker/abc/memory.usage_in_bytes", "2000000000\n");
  absl::StatusOr<HostMemoryInfo> info = ReadHostMemoryInfo(paths_);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_TRUE(info->cgroup_limit.has_value());
  EXPECT_EQ(*info->cgroup_limit, 2147483648);
  EXPECT_EQ(info->Available(), 2147483648 - 2000000000);
}

TEST_F(HostMemoryTest, UsageAboveTheLimitLeavesNothing) {
  Write(paths_.self_cgroup, "0::/\n");
  Write(paths_.cgroup_root + "/memory.max", "1000\n");
  Write(paths_.cgroup_root + "/memory.current", "5000\n");
  absl::StatusOr<HostMemoryInfo> info = ReadHostMemoryInfo(paths_);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->Available(), 0);
}

TEST_F(HostMemoryTest, MalformedOrMissingMeminfoNamesTheFile) {
  Write(paths_.meminfo, "MemTotal: 10 kB\n");
  absl::StatusOr<HostMemoryInfo> info = ReadHostMemoryInfo(paths_);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(info.status().message(), HasSubstr(paths_.meminfo));
  EXPECT_THAT(info.status().message(), HasSubstr("MemAvailable"));

  Write(paths_.meminfo, "MemTotal: 10 kB\nMemAvailable: lots kB\n");
  info = ReadHostMemoryInfo(paths_);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(info.status().message(), HasSubstr("MemAvailable has a malformed value"));

  paths_.meminfo = root_ + "/missing";
  EXPECT_EQ(ReadHostMemoryInfo(paths_).status().code(), absl::StatusCode::kNotFound);
}

TEST(HostMemoryRealTest, TheRealHostHasMemory) {
  absl::StatusOr<HostMemoryInfo> info = ReadHostMemoryInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GT(info->mem_total, 0);
  EXPECT_GT(info->Available(), 0);
  EXPECT_LE(info->Available(), info->mem_total);
  EXPECT_EQ(HostMemoryCapacityBytes(), info->Capacity());
}

}  // namespace
}  // namespace core
