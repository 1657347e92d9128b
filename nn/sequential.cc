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

absl::StatusOr<core::Tensor> Sequential::ForwardImpl(const core::Tensor& x) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  core::Tensor h = x;
  for (const auto& m : modules_) {
    ASSIGN_OR_RETURN(h, m->Forward(h));
  }
  return h;
}

absl::StatusOr<core::Tensor> Sequential::BackwardImpl(const core::Tensor& grad_output) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  core::Tensor g = grad_output;
  for (auto it = modules_.rbegin(); it != modules_.rend(); ++it) {
    ASSIGN_OR_RETURN(g, (*it)->Backward(g));
  }
  return g;
}

}  // namespace nn
