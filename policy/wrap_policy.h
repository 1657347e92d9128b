// Auto-wrap policies: which modules of a model become FSDP units.
//
// A policy answers one question per module, bottom-up: should this module be the root
// of a unit? It sees the module and a WrapContext (path, type, depth, own numel and the
// numel of parameters below it that no unit has claimed yet). The planner (policy/plan.h)
// and fsdp::FullyShard apply it; see NOTE [Bottom-up application] in plan.h.
//
//   // Every TransformerBlock, plus anything else holding >= 1M unclaimed elements,
//   // but never a bare LayerNorm:
//   policy::SizeBasedOptions big;
//   big.min_num_params = 1000000;
//   policy::WrapPolicyPtr p = policy::And({
//       policy::Or({policy::ModuleTypes({"TransformerBlock"}), policy::SizeBased(big)}),
//       policy::Not(policy::ModuleTypes({"LayerNorm"}))});
//   RETURN_IF_ERROR(p->Validate());
//   bool wrap = p->ShouldWrap(module, context);
//
// Policies are immutable and may be shared between threads and plans.
#ifndef POLICY_WRAP_POLICY_H_
#define POLICY_WRAP_POLICY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/module.h"

namespace policy {

// What a policy knows about the module it is asked about. The planner fills it in;
// tests may build one by hand.
struct WrapContext {
  // Dotted path from the plan's root ("blocks.0.attn"); "" for the root.
  std::string path;
  // module.TypeName().
  std::string type_name;
  // 0 for the root, 1 for its children, ...
  int depth = 0;
  // Elements of the distinct, non-ignored parameters registered directly on the module.
  int64_t own_numel = 0;
  // Elements of the parameters this module would claim if it became a unit now: those
  // registered in its subtree that are not ignored, not held by an existing unit or a
  // unit chosen below it, and whose tied uses all lie in this subtree (a tied
  // parameter belongs to the lowest common ancestor of its uses). Each counted once.
  int64_t unwrapped_subtree_numel = 0;
  // Type names of the ancestors, root first, without the module itself.
  std::vector<std::string> ancestor_types;
};

// Decides which modules become unit roots. Implementations must be deterministic: the
// same module and context give the same answer on every rank.
class WrapPolicy {
 public:
  virtual ~WrapPolicy() = default;

  // True when `module` should become the root of a unit that claims the context's
  // unwrapped parameters. Never called for the plan's root (always a unit), ignored
  // modules, modules inside existing units, or modules with nothing left to claim.
  virtual bool ShouldWrap(const core::Module& module, const WrapContext& context) const = 0;

  // A short, stable description with the policy's options, e.g.
  // "size_based(min_num_params=100000)". Recorded in the plan.
  virtual std::string Name() const = 0;

  // What the policy decides, as a string: two policies with equal Identity() give the
  // same ShouldWrap answer for every module and context. fsdp compares identities when
  // a unit root is wrapped again (fsdp::FirstDifferingOption), so a re-wrap never
  // keeps units another policy planned. The default is Name() plus this object's
  // address: only the very same object is equal to it, whatever it is called. A policy
  // whose Name() carries every option ShouldWrap reads (the built-ins, path_glob)
  // returns Name(), so that equal policies built twice (e.g. from one config per stage)
  // compare equal. Lambda() policies are unique per Lambda() call.
  virtual std::string Identity() const;

  // Why ShouldWrap returned true for this module, for the plan's `reason` field, e.g.
  // "size_based: 7087872 unwrapped >= min_num_params 100000". Defaults to Name().
  virtual std::string Explain(const core::Module& module, const WrapContext& context) const;

  // OK when the policy's options are usable; InvalidArgument naming the option
  // otherwise. Plan() calls this before anything else.
  virtual absl::Status Validate() const { return absl::OkStatus(); }
};

using WrapPolicyPtr = std::shared_ptr<const WrapPolicy>;

// Options of the size-based policy (PyTorch's size_based_auto_wrap_policy).
struct SizeBasedOptions {
  // Wrap a module once it would claim at least this many elements. Must be >= 0.
  int64_t min_num_params = 100000000;
  // Modules of these types are never wrapped (their parameters go to an ancestor).
  std::vector<std::string> excluded_types;
  // Nothing strictly inside a module of these types is wrapped: the whole subtree goes
  // into one unit rooted at that module, or into an ancestor's.
  std::vector<std::string> force_leaf_types;
};

// Wraps when unwrapped_subtree_numel >= min_num_params, the type is not excluded, and
// no ancestor has a force-leaf type.
WrapPolicyPtr SizeBased(SizeBasedOptions options);

// Wraps modules whose type name is one of `type_names`.
WrapPolicyPtr ModuleTypes(std::vector<std::string> type_names);

// Wraps modules whose type name is one of `type_names` and whose index, the last
// component of their path read as an integer ("blocks.6" -> 6: the children of a
// Sequential or a list of blocks), is a multiple of `k`: with k = 2, blocks 0, 2, 4, ...
// (TorchTitan's "layer_id % ac_freq == 0"). A module of those types whose last path
// component is not an integer is never picked. Meant as an activation-checkpoint policy
// (FullyShardOptions::checkpoint_policy: every k-th block recomputed); Validate() fails
// for k < 1 or no type names.
WrapPolicyPtr EveryKth(std::vector<std::string> type_names, int64_t k);

// Wraps every module it is asked about.
WrapPolicyPtr Always();

// Wraps nothing (the plan is then one unit at the root).
WrapPolicyPtr Never();

using WrapPredicate = std::function<bool(const core::Module&, const WrapContext&)>;

// Wraps when `predicate` returns true; `name` is what Name() and Explain() report.
// Validate() fails for an empty predicate. Its Identity() is unique to this call (a
// predicate cannot be compared): two Lambda() policies never compare equal, even with
// the same name and predicate; the same returned object always does.
WrapPolicyPtr Lambda(WrapPredicate predicate, std::string name = "lambda");

// Wraps when any of `policies` does (none: never). Explain() names the first that did.
WrapPolicyPtr Or(std::vector<WrapPolicyPtr> policies);

// Wraps when all of `policies` do (none: always).
WrapPolicyPtr And(std::vector<WrapPolicyPtr> policies);

// Wraps when `policy` does not.
WrapPolicyPtr Not(WrapPolicyPtr policy);

}  // namespace policy

#endif  // POLICY_WRAP_POLICY_H_
