#include "nn/sequential.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/internal/validate.h"

namespace nn {

Sequential::Sequential(std::vector<std::shared_ptr<core::Module>> modules)
    : modules_(std::move(modules)) {
  for (size_t i = 0; i < modules_.size(); ++i) {
    if (modules_[i] == nullptr) {
      if (config_error_.empty()) config_error_ = absl::StrCat("module ", i, " is null");
      continue;
    }
    RegisterModule(std::to_string(i), modules_[i]);
  }
}

std::shared_ptr<Sequential> Sequential::Make(std::vector<std::shared_ptr<core::Module>> modules) {
  return std::shared_ptr<Sequential>(new Sequential(std::move(modules)));
}

absl::StatusOr<core::Tensors> Sequential::ForwardGraph(const core::Tensors& inputs) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  core::Tensors h = inputs;
  for (const auto& m : modules_) {
    ASSIGN_OR_RETURN(h, m->Call(std::vector<core::Arg>(h.begin(), h.end())));
  }
  return h;
}

}  // namespace nn
