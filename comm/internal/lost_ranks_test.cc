#include "comm/internal/lost_ranks.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace comm {
namespace internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string TempPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name, "_", ::getpid());
}

TEST(ParseLostRanksTest, KeepsDistinctRanksInRangeAndNamesTheOtherLines) {
  const LostRanks lost = ParseLostRanks("2\n 0 \n\n2\nrank 1\n3\n-1\n+1\n1", 3);
  EXPECT_THAT(lost.ranks, ElementsAre(0, 1, 2));
  EXPECT_THAT(lost.ignored, ElementsAre("rank 1", "3", "-1", "+1"));
  EXPECT_THAT(ParseLostRanks("", 3).ranks, IsEmpty());
  EXPECT_THAT(ParseLostRanks("\n \n", 3).ignored, IsEmpty());
}

TEST(LostRanksFileTest, ATemporaryFileStartsEmptyAndIsRemovedWithItsDirectory) {
  std::string path;
  {
    LostRanksFile file;
    ASSERT_TRUE(file.Open("").ok());
    path = file.path();
    ASSERT_TRUE(Exists(path)) << path;
    absl::StatusOr<LostRanks> lost = file.Read(4);
    ASSERT_TRUE(lost.ok()) << lost.status();
    EXPECT_THAT(lost->ranks, IsEmpty());
    std::ofstream(path, std::ios::app) << "3\n1\n";
    lost = file.Read(4);
    ASSERT_TRUE(lost.ok()) << lost.status();
    EXPECT_THAT(lost->ranks, ElementsAre(1, 3));
    ASSERT_TRUE(file.Truncate().ok());
    EXPECT_THAT(file.Read(4)->ranks, IsEmpty());
  }
  EXPECT_FALSE(Exists(path)) << path;
  EXPECT_FALSE(Exists(path.substr(0, path.rfind('/')))) << path;
}

TEST(LostRanksFileTest, AGivenFileIsEmptiedAtOpenAndKept) {
  const std::string path = TempPath("given_lost_ranks");
  std::ofstream(path) << "0\n";  // stale: from an earlier job
  {
    LostRanksFile file;
    ASSERT_TRUE(file.Open(path).ok());
    EXPECT_EQ(file.path(), path);
    EXPECT_THAT(file.Read(2)->ranks, IsEmpty());
  }
  EXPECT_TRUE(Exists(path));
  LostRanksFile bad;
  const absl::Status s = bad.Open("/nonexistent/dir/lost");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("/nonexistent/dir/lost"));
}

}  // namespace
}  // namespace internal
}  // namespace comm
