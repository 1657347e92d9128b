// Wrap plans: apply a WrapPolicy to a module tree and describe the FSDP units that
// result, without sharding anything. fsdp::FullyShard creates its units from the plan;
// the plan CLI (policy/plan_main.cc) prints it.
//
//   ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> gpt, nn::Gpt::Create(config));
//   ASSIGN_OR_RETURN(policy::WrapPlan plan,
//                    policy::Plan(*gpt, *policy::ModuleTypes({"TransformerBlock"}),
//                                 /*world_size=*/8));
//   // plan.units(): blocks.0 ... blocks.N-1, then the root; plan.tied(0) says that
//   // wte.weight (also lm_head.weight) went into the root unit.
//   uint64_t fp = policy::Fingerprint(plan);   // all-gathered by fsdp to compare ranks
//
// NOTE [Bottom-up application]: modules are visited in post-order (children before
// their parent, children in registration order), over the tree of first registrations
// (a module reachable twice is visited once, at its first path, as in
// Module::NamedModules()). For each module the planner computes its pending parameters:
// those whose home lies in its subtree and that no unit below it has claimed. A
// parameter's home is the module that registers it, or for a parameter used in several
// places (tied weights, shared modules) the lowest common ancestor of all those uses.
// Then:
//   - an ignored module (and everything below it) is skipped; its parameters are
//     unmanaged and listed in the plan's `ignored`;
//   - an existing unit stays a unit holding exactly the parameters it already holds
//     (reason "existing unit"); the policy is not asked about it or its descendants;
//     pending parameters it does not hold pass on to its ancestors;
//   - the root always becomes a unit and takes everything still pending (reason "root");
//     the policy is not asked about the root;
//   - any other module with pending parameters is offered to the policy
//     (WrapContext::unwrapped_subtree_numel = their numel); if it accepts, the module
//     becomes a unit and claims them (reason = WrapPolicy::Explain()). A module with
//     nothing pending is never offered: a unit without parameters would be pure overhead.
// So every managed parameter lands in exactly one unit: the nearest unit at or above its
// home. For a tied parameter that is its lowest common ancestor unit, and the plan's
// `tied` records it.
#ifndef POLICY_PLAN_H_
#define POLICY_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/module.h"
#include "core/parameter.h"
#include "policy/plan.pb.h"
#include "policy/wrap_policy.h"

namespace policy {

// A unit that exists before planning (fsdp: the user wrapped a submodule first).
struct ExistingUnit {
  // The unit's root module; must be in the plan's tree.
  const core::Module* module = nullptr;
  // The parameters the unit already holds; each must be reachable from `module`.
  std::vector<core::ParameterPtr> params;
};

struct PlanOptions {
  // Modules whose parameters are not managed, by dotted path from the root or by
  // identity. Their descendants are ignored too. The root cannot be ignored.
  std::vector<std::string> ignored_paths;
  std::vector<const core::Module*> ignored_modules;
  // Units that already exist; see NOTE [Bottom-up application].
  std::vector<ExistingUnit> existing_units;
  // Activation checkpointing (NOTE [Activation checkpointing] in core/module.h): when
  // set, asked about every module except the root, ignored modules and existing units
  // with what is inside them, in pre-order, with WrapContext::unwrapped_subtree_numel =
  // the managed parameter elements in the module's subtree; those it accepts are the
  // plan's `checkpointed`. Not part of the fingerprint: checkpointing changes no
  // collective.
  const WrapPolicy* checkpoint_policy = nullptr;
};

// The plan of `root` under `policy` for `world_size` ranks. InvalidArgument for a world
// size below 1, an invalid policy (WrapPolicy::Validate), an ignored path or module that
// is not in the tree (or is the root), or an existing unit that is not in the tree, is
// ignored, or holds a parameter it cannot reach or that another existing unit holds.
absl::StatusOr<WrapPlan> Plan(const core::Module& root, const WrapPolicy& policy, int world_size,
                              const PlanOptions& options = {});

// NOTE [Plan fingerprint encoding]: fingerprints are FNV-1a 64 (offset basis
// 0xcbf29ce484222325, prime 0x100000001b3) over bytes written as follows, where u64(x)
// is x as 8 bytes least significant first and str(s) is u64(byte length) then the bytes:
//   unit: str("policy.WrapUnit.v1") str(path) str(type_name) u64(#param_names)
//         str(name) for each parameter name, u64(numel) u64(padded_numel)
//         u64(existing ? 1 : 0)
//   plan: str("policy.WrapPlan.v1") u64(world_size) u64(#units)
//         u64(UnitFingerprint(unit)) for each unit in order, u64(#ignored)
//         str(name) u64(numel) for each ignored parameter
// (signed values as their two's-complement u64). Nothing depends on the host, compiler
// or protobuf's serialisation, so equal plans hash equally on every machine. Reasons,
// policy names, depths and memory figures are not hashed: they follow from the rest or
// do not change what fsdp builds.

// The fingerprint of one unit (NOTE [Plan fingerprint encoding]).
uint64_t UnitFingerprint(const WrapUnit& unit);

// The fingerprint of the plan (NOTE [Plan fingerprint encoding]). Any change to a unit's
// path, type, parameters, numel, to the ignored parameters or to the world size changes
// it (up to 64-bit hash collisions).
uint64_t Fingerprint(const WrapPlan& plan);

// UnitFingerprint of each unit, in order (what fsdp all-gathers to name the first
// differing unit).
std::vector<uint64_t> UnitFingerprints(const WrapPlan& plan);

// "" when the fingerprinted contents of `a` and `b` agree; otherwise a sentence naming
// the first difference, e.g. "unit 3: path blocks.2 (TransformerBlock) vs blocks.3
// (TransformerBlock)", "world_size 8 vs 4", or "unit 12: only in the first plan
// (<root> (Gpt))".
std::string FirstDifference(const WrapPlan& a, const WrapPlan& b);

// Like FirstDifference, for a local plan and another rank's UnitFingerprints: "" when
// they agree, else e.g. "unit 3 (blocks.3, TransformerBlock) differs" or "unit count 13
// vs 12".
std::string FirstDifferingUnit(const WrapPlan& local, absl::Span<const uint64_t> remote);

}  // namespace policy

#endif  // POLICY_PLAN_H_
