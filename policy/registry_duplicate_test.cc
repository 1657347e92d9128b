// Two registrations of one name in the global registry, as when two linked-in libraries
// both register it: neither aborts, and the name is unusable until one is removed.
#include <string>

#include "gtest/gtest.h"
#include "policy/registry.h"

namespace {

absl::StatusOr<policy::WrapPolicyPtr> MakeFirst(const policy::PolicyParams&) {
  return policy::Always();
}
absl::StatusOr<policy::WrapPolicyPtr> MakeSecond(const policy::PolicyParams&) {
  return policy::Never();
}

POLICY_REGISTER_WRAP_POLICY("dup_rule", MakeFirst);
POLICY_REGISTER_WRAP_POLICY("dup_rule", MakeSecond);
POLICY_REGISTER_WRAP_POLICY("unique_rule", MakeFirst);

bool Has(absl::string_view haystack, const std::string& needle) {
  return haystack.find(needle) != absl::string_view::npos;
}

TEST(RegistryDuplicateTest, LookupOfDuplicateFailsWithBothSites) {
  absl::StatusOr<policy::WrapPolicyPtr> p = policy::PolicyRegistry::Global().Create("dup_rule", {});
  ASSERT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(p.status().message(), "wrap policy 'dup_rule' is registered 2 times")) << p.status();
  EXPECT_TRUE(Has(p.status().message(), "policy/registry_duplicate_test.cc:17")) << p.status();
  EXPECT_TRUE(Has(p.status().message(), "policy/registry_duplicate_test.cc:18")) << p.status();
}

TEST(RegistryDuplicateTest, CheckRegistrationsNamesTheDuplicate) {
  absl::Status s = policy::PolicyRegistry::Global().CheckRegistrations();
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(s.message(), "'dup_rule'")) << s;
  EXPECT_FALSE(Has(s.message(), "unique_rule")) << s;
}

TEST(RegistryDuplicateTest, OtherNamesStillWork) {
  EXPECT_TRUE(policy::PolicyRegistry::Global().Create("unique_rule", {}).ok());
  EXPECT_TRUE(policy::PolicyRegistry::Global().Create("size_based", {}).ok());
}

}  // namespace
