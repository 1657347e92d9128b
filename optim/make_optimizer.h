// MakeOptimizer: an SGD or an AdamW from one options struct, for code that lets its user
// choose (a TrainModule's ConfigureOptimizer, a config file).
//
//   optim::OptimizerOptions options;
//   options.kind = optim::OptimizerKind::kSgd;
//   options.sgd.lr = 0.1;
//   options.sgd.momentum = 0.9;
//   ASSIGN_OR_RETURN(std::unique_ptr<optim::Optimizer> opt,
//                    optim::MakeOptimizer(model->NamedParameters(), options));
#ifndef OPTIM_MAKE_OPTIMIZER_H_
#define OPTIM_MAKE_OPTIMIZER_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "optim/adamw.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"

namespace optim {

enum class OptimizerKind { kAdamW, kSgd };

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kAdamW;
  AdamWOptions adamw;  // used for kAdamW
  SgdOptions sgd;      // used for kSgd
};

// AdamW::Create or SGD::Create over `params` with the kind's options (their errors).
absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(std::vector<core::NamedParameter> params,
                                                         const OptimizerOptions& options);

}  // namespace optim

#endif  // OPTIM_MAKE_OPTIMIZER_H_
