// Fuzz target: WrapPolicyConfig text -> policy (policy/config.h), with the built-in
// policies and the path_glob example registered. Any bytes must give a policy or an
// error, never a crash, an abort, a stack overflow (deep nesting) or a sanitizer
// report. Corpus: policy/testdata/policy_config_fuzz_corpus/.
#include <cstddef>
#include <cstdint>
#include <string>

#include "policy/config.h"
#include "policy/testing/test_modules.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<policy::ConfiguredPolicy> built = policy::BuildPolicyFromText(text);
  if (!built.ok()) return 0;
  // Exercise the built policy: its name, validation and decisions on a small module.
  (void)built->policy->Name();
  (void)built->policy->Validate();
  auto module = policy::testing::TestModule::Make("Block");
  policy::WrapContext context;
  context.type_name = "Block";
  context.unwrapped_subtree_numel = static_cast<int64_t>(size);
  for (const char* path : {"", "blocks", "blocks.0", "blocks.12.attn.qkv"}) {
    context.path = path;
    (void)built->policy->ShouldWrap(*module, context);
  }
  return 0;
}
