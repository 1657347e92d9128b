// A conformance suite every Store implementation must pass. A store's test
// instantiates it with a factory:
//
//   INSTANTIATE_TEST_SUITE_P(HashStore, StoreConformanceTest,
//       ::testing::Values(comm::testing::StoreFactory{
//           "HashStore", [] { return std::make_shared<comm::HashStore>(); }}),
//       comm::testing::StoreFactoryName);
//
// Each test gets a fresh store from the factory (and, where it needs a second client
// of the same store, calls `connect_another`).
#ifndef COMM_TESTING_STORE_CONFORMANCE_H_
#define COMM_TESTING_STORE_CONFORMANCE_H_

#include <functional>
#include <memory>
#include <string>

#include "comm/store.h"
#include "gtest/gtest.h"

namespace comm {
namespace testing {

struct StoreFactory {
  std::string name;
  // A new, empty store.
  std::function<std::shared_ptr<Store>()> make;
  // Another client of the same store as `store` (for stores reachable from several
  // objects); null means "share the object itself".
  std::function<std::shared_ptr<Store>(const std::shared_ptr<Store>& store)> connect_another;
  // Whether DeleteKey is implemented.
  bool supports_delete = true;
};

std::string StoreFactoryName(const ::testing::TestParamInfo<StoreFactory>& info);

class StoreConformanceTest : public ::testing::TestWithParam<StoreFactory> {
 protected:
  void SetUp() override;
  std::shared_ptr<Store> Another();

  std::shared_ptr<Store> store_;
};

}  // namespace testing
}  // namespace comm

#endif  // COMM_TESTING_STORE_CONFORMANCE_H_
