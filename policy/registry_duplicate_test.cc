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
POLICY_REGISTER_WRAP_POLICY("never_rule", MakeSecond);

bool Has(absl::string_view haystack, const std::string& needle) {
  return haystack.find(needle) != absl::string_view::npos;
}

TEST(RegistryDuplicateTest, LookupOfDuplicateFailsWithBothSites) {
  absl::StatusOr<policy::WrapPolicyPtr> p = policy::PolicyRegistry::Global().Create("dup_rule", {});
  ASSERT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(p.status().message(), "wrap policy 'dup_rule' is registered 2 times"))
      << p.status();
  EXPECT_TRUE(Has(p.status().message(), "policy/registry_duplicate_test.cc:17")) << p.status();
  EXPECT_TRUE(Has(p.status().message(), "policy/registry_duplicate_test.cc:18")) << p.status();
}

TEST(RegistryDuplicateTest, CheckRegistrationsNamesTheDuplicate) {
  absl::Status s = policy::PolicyRegistry::Global().CheckRegistrations();
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(s.message(), "'dup_rule'")) << s;
  EXPECT_FALSE(Has(s.message(), "unique_rule")) << s;
}

// Each other name still builds what its own factory builds: "unique_rule" MakeFirst's
// policy, "never_rule" MakeSecond's, "size_based" the built-in one.
TEST(RegistryDuplicateTest, OtherNamesStillWork) {
  const auto name_of = [](absl::string_view rule) -> std::string {
    absl::StatusOr<policy::WrapPolicyPtr> p = policy::PolicyRegistry::Global().Create(rule, {});
    if (!p.ok()) return std::string(p.status().message());
    return (*p)->Name();
  };
  EXPECT_EQ(name_of("unique_rule"), "always");
  EXPECT_EQ(name_of("never_rule"), "never");
  EXPECT_EQ(name_of("size_based").rfind("size_based(", 0), 0u) << name_of("size_based");
}

}  // namespace
