#include "mlp_blocks_policy.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "policy/registry.h"

namespace consumer {
namespace {

class MlpBlocksPolicy : public policy::WrapPolicy {
 public:
  explicit MlpBlocksPolicy(int64_t min_params) : min_params_(min_params) {}

  bool ShouldWrap(const core::Module& /*module*/,
                  const policy::WrapContext& context) const override {
    return context.type_name == "MlpBlock" && context.unwrapped_subtree_numel >= min_params_;
  }

  std::string Name() const override {
    return absl::StrCat("mlp_blocks(min_params=", min_params_, ")");
  }

  // Name() carries everything ShouldWrap reads, so two of these with the same
  // min_params decide alike: a stage that builds the policy again (from its own config)
  // still reuses the units the first stage made.
  std::string Identity() const override { return Name(); }

  absl::Status Validate() const override {
    if (min_params_ < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("mlp_blocks: parameter 'min_params' must be >= 0, got ", min_params_));
    }
    return absl::OkStatus();
  }

 private:
  int64_t min_params_;
};

absl::StatusOr<policy::WrapPolicyPtr> MakeMlpBlocks(const policy::PolicyParams& params) {
  RETURN_IF_ERROR(params.CheckKeys({"min_params"}));
  ASSIGN_OR_RETURN(int64_t min_params, params.GetInt64("min_params", 0));
  return MlpBlocks(min_params);
}

POLICY_REGISTER_WRAP_POLICY("mlp_blocks", MakeMlpBlocks);

}  // namespace

policy::WrapPolicyPtr MlpBlocks(int64_t min_params) {
  return std::make_shared<MlpBlocksPolicy>(min_params);
}

}  // namespace consumer
