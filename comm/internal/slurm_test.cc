#include "comm/internal/slurm.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace comm {
namespace internal {
namespace {

using Names = std::vector<std::string>;

TEST(SlurmHostListTest, ExpandsRangesListsPaddingAndSeveralGroups) {
  EXPECT_EQ(ExpandSlurmHostList("login1").value(), Names({"login1"}));
  EXPECT_EQ(ExpandSlurmHostList("gpu[07-09,12],login1").value(),
            Names({"gpu07", "gpu08", "gpu09", "gpu12", "login1"}));
  EXPECT_EQ(ExpandSlurmHostList("n[8-11]").value(), Names({"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(ExpandSlurmHostList("r[1-2]c[03-04]x").value(),
            Names({"r1c03x", "r1c04x", "r2c03x", "r2c04x"}));
  EXPECT_EQ(ExpandSlurmHostList("a[5],b").value(), Names({"a5", "b"}));
}

TEST(SlurmHostListTest, MalformedListsAreInvalidArgumentQuotingTheList) {
  for (const char* bad :
       {"", "a,,b", "node[01-", "node[]", "node[3-1]", "node[x]", "node[1-2-3]"}) {
    absl::StatusOr<Names> r = ExpandSlurmHostList(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find(std::string("SLURM_JOB_NODELIST=\"") + bad + "\""),
              std::string::npos)
        << r.status();
  }
}

TEST(SlurmTasksPerNodeTest, ExpandsRepeats) {
  EXPECT_EQ(ExpandSlurmTasksPerNode("4").value(), std::vector<int>({4}));
  EXPECT_EQ(ExpandSlurmTasksPerNode("4(x2),2").value(), std::vector<int>({4, 4, 2}));
  EXPECT_EQ(ExpandSlurmTasksPerNode("1,3(x1)").value(), std::vector<int>({1, 3}));
  for (const char* bad : {"", "0", "2(x)", "2(x0)", "2(3)", "x", "2,"}) {
    EXPECT_EQ(ExpandSlurmTasksPerNode(bad).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

}  // namespace
}  // namespace internal
}  // namespace comm
