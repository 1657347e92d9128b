// A custom auto-wrap rule, written the way a policy author would: wrap every MlpBlock
// that would claim at least `min_params` parameter elements. Linking
// :mlp_blocks_policy (alwayslink) registers it as "mlp_blocks", so a WrapPolicyConfig or
// the registry selects it by name:
//
//   policy::PolicyParams params;
//   params.Add("min_params", "100");
//   ASSIGN_OR_RETURN(policy::WrapPolicyPtr p,
//                    policy::PolicyRegistry::Global().Create("mlp_blocks", params));
#ifndef EXAMPLES_CONSUMER_MLP_BLOCKS_POLICY_H_
#define EXAMPLES_CONSUMER_MLP_BLOCKS_POLICY_H_

#include <cstdint>

#include "policy/wrap_policy.h"

namespace consumer {

// The policy itself, for direct use. min_params must be >= 0 (Validate()).
policy::WrapPolicyPtr MlpBlocks(int64_t min_params);

}  // namespace consumer

#endif  // EXAMPLES_CONSUMER_MLP_BLOCKS_POLICY_H_
