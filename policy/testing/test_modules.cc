#include "policy/testing/test_modules.h"

#include "absl/strings/str_cat.h"
#include "core/tensor.h"

namespace policy {
namespace testing {

core::ParameterPtr TestModule::AddParam(const std::string& name, int64_t numel) {
  return RegisterParameter(
      name, core::Tensor::Zeros({numel}, core::DType::kFloat32, core::MemoryTag::kParam));
}

core::ParameterPtr TestModule::AddParam(const std::string& name, core::ParameterPtr shared) {
  return RegisterParameter(name, std::move(shared));
}

std::shared_ptr<TestModule> MakeLeaf(const std::string& type_name,
                                     const std::vector<int64_t>& numels) {
  auto leaf = TestModule::Make(type_name);
  for (size_t i = 0; i < numels.size(); ++i) leaf->AddParam(absl::StrCat("w", i), numels[i]);
  return leaf;
}

std::vector<std::string> UnitPaths(const WrapPlan& plan) {
  std::vector<std::string> out;
  for (const WrapUnit& unit : plan.units()) out.push_back(unit.path());
  return out;
}

const WrapUnit* FindUnit(const WrapPlan& plan, const std::string& path) {
  for (const WrapUnit& unit : plan.units()) {
    if (unit.path() == path) return &unit;
  }
  return nullptr;
}

std::vector<std::string> UnitParams(const WrapPlan& plan, const std::string& path) {
  const WrapUnit* unit = FindUnit(plan, path);
  if (unit == nullptr) return {};
  return std::vector<std::string>(unit->param_names().begin(), unit->param_names().end());
}

}  // namespace testing
}  // namespace policy
