#include "comm/prefix_store.h"

#include <memory>

#include "comm/hash_store.h"
#include "comm/testing/store_conformance.h"
#include "gtest/gtest.h"

namespace comm {
namespace {

using ::comm::testing::StoreConformanceTest;

INSTANTIATE_TEST_SUITE_P(
    PrefixStore, StoreConformanceTest,
    ::testing::Values(testing::StoreFactory{
        "PrefixOverHash",
        [] { return std::make_shared<PrefixStore>(std::make_shared<HashStore>(), "job"); }}),
    testing::StoreFactoryName);

TEST(PrefixStoreTest, KeysLandUnderThePrefixAndGroupsDoNotCollide) {
  auto base = std::make_shared<HashStore>();
  PrefixStore a(base, "a");
  PrefixStore b(base, "b");
  ASSERT_TRUE(a.Set("0", "from-a").ok());
  ASSERT_TRUE(b.Set("0", "from-b").ok());
  EXPECT_EQ(base->Get("a/0", absl::Seconds(1)).value(), "from-a");
  EXPECT_EQ(base->Get("b/0", absl::Seconds(1)).value(), "from-b");
  EXPECT_EQ(a.Get("0", absl::Seconds(1)).value(), "from-a");
  EXPECT_FALSE(a.Check({"1"}).value());
}

TEST(PrefixStoreTest, PrefixesNest) {
  auto base = std::make_shared<HashStore>();
  PrefixStore inner(std::make_shared<PrefixStore>(base, "world"), "sub1");
  ASSERT_TRUE(inner.Add("n", 3).ok());
  EXPECT_EQ(base->Get("world/sub1/n", absl::Seconds(1)).value(), "3");
}

TEST(PrefixStoreTest, ErrorsFromTheBaseNameTheFullKey) {
  auto base = std::make_shared<HashStore>();
  PrefixStore p(base, "grp");
  absl::Status s = p.Wait({"k"}, absl::Milliseconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("grp/k"), std::string::npos) << s;
}

}  // namespace
}  // namespace comm
