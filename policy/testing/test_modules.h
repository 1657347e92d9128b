// Test-only modules for policy tests: a module of any type name with parameters of given
// sizes and any children, plus accessors that summarise a WrapPlan for assertions.
//
//   using policy::testing::TestModule;
//   auto root = TestModule::Make("Net");
//   auto block = root->AddChild("block", TestModule::Make("Block"));
//   core::ParameterPtr w = block->AddParam("weight", 12);
//   root->AddChild("head", TestModule::Make("Head"))->AddParam("w", w);  // tied to block.weight
//   // Planned with ModuleTypes({"Block"}): the weight's uses meet at the root, so
//   // UnitPaths(plan) == {""} and UnitParams(plan, "") == {"block.weight"}.
#ifndef POLICY_TESTING_TEST_MODULES_H_
#define POLICY_TESTING_TEST_MODULES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/module.h"
#include "core/parameter.h"
#include "policy/plan.pb.h"

namespace policy {
namespace testing {

// Identity forward and backward; exists only to have a shape for the planner.
class TestModule : public core::Module {
 public:
  static std::shared_ptr<TestModule> Make(std::string type_name) {
    return std::shared_ptr<TestModule>(new TestModule(std::move(type_name)));
  }

  std::string TypeName() const override { return type_name_; }

  // Registers a new fp32 parameter of `numel` elements (shape [numel]).
  core::ParameterPtr AddParam(const std::string& name, int64_t numel);
  // Registers an existing parameter under `name` (ties it).
  core::ParameterPtr AddParam(const std::string& name, core::ParameterPtr shared);

  // Registers `child` under `name` and returns it.
  template <typename M>
  std::shared_ptr<M> AddChild(const std::string& name, std::shared_ptr<M> child) {
    return RegisterModule(name, std::move(child));
  }

 protected:
  absl::StatusOr<core::Tensor> ForwardImpl(const core::Tensor& x) override { return x; }
  absl::StatusOr<core::Tensor> BackwardImpl(const core::Tensor& g) override { return g; }

 private:
  explicit TestModule(std::string type_name) : type_name_(std::move(type_name)) {}
  std::string type_name_;
};

// A TestModule of `type_name` with one parameter "w{i}" per entry of `numels`.
std::shared_ptr<TestModule> MakeLeaf(const std::string& type_name,
                                     const std::vector<int64_t>& numels);

// The units' paths in plan order.
std::vector<std::string> UnitPaths(const WrapPlan& plan);

// The parameter names of the unit rooted at `path`; empty if there is no such unit.
std::vector<std::string> UnitParams(const WrapPlan& plan, const std::string& path);

// The unit rooted at `path`, or nullptr.
const WrapUnit* FindUnit(const WrapPlan& plan, const std::string& path);

}  // namespace testing
}  // namespace policy

#endif  // POLICY_TESTING_TEST_MODULES_H_
