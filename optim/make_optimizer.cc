#include "optim/make_optimizer.h"

#include <utility>

#include "core/status_macros.h"

namespace optim {

absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(std::vector<core::NamedParameter> params,
                                                         const OptimizerOptions& options) {
  if (options.kind == OptimizerKind::kSgd) {
    ASSIGN_OR_RETURN(std::unique_ptr<SGD> sgd, SGD::Create(std::move(params), options.sgd));
    return std::unique_ptr<Optimizer>(std::move(sgd));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<AdamW> adamw, AdamW::Create(std::move(params), options.adamw));
  return std::unique_ptr<Optimizer>(std::move(adamw));
}

}  // namespace optim
