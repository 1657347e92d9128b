#include "comm/hash_store.h"

#include <memory>

#include "comm/testing/store_conformance.h"
#include "gtest/gtest.h"

namespace comm {
namespace {

using ::comm::testing::StoreConformanceTest;

INSTANTIATE_TEST_SUITE_P(HashStore, StoreConformanceTest,
                         ::testing::Values(testing::StoreFactory{
                             "HashStore", [] { return std::make_shared<HashStore>(); }}),
                         testing::StoreFactoryName);

TEST(HashStoreTest, CountsKeys) {
  HashStore store;
  ASSERT_TRUE(store.Set("a", "1").ok());
  ASSERT_TRUE(store.Add("b", 2).ok());
  EXPECT_EQ(store.NumKeys(), 2);
}

}  // namespace
}  // namespace comm
