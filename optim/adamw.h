// AdamW: Adam with decoupled weight decay, with torch.optim.AdamW's exact update rule
// (amsgrad off, not maximising). For each parameter p with gradient g, at its t-th step
// (t counts only steps where p had a gradient, like PyTorch's state['step']):
//
//   p = p * (1 - lr * weight_decay)
//   m = beta1 * m + (1 - beta1) * g            ("exp_avg", zero before step 1)
//   v = beta2 * v + (1 - beta2) * g * g        ("exp_avg_sq", zero before step 1)
//   m_hat = m / (1 - beta1^t),  v_hat = v / (1 - beta2^t)
//   p = p - lr * m_hat / (sqrt(v_hat) + eps)
//
//   optim::AdamWOptions options;
//   options.lr = 3e-4;
//   ASSIGN_OR_RETURN(std::unique_ptr<optim::AdamW> adamw,
//                    optim::AdamW::Create(module->NamedParameters(), options));
//   RETURN_IF_ERROR(adamw->Step());
//
// Elementwise arithmetic is float32 in PyTorch's order of operations. State tensors are
// float32, tag kOptim, allocated at a parameter's first step; see NOTE [Optimizer and
// shards] in optim/optimizer.h.
#ifndef OPTIM_ADAMW_H_
#define OPTIM_ADAMW_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/parameter.h"
#include "optim/optimizer.h"

namespace optim {

// torch.optim.AdamW's options with its defaults.
struct AdamWOptions {
  double lr = 1e-3;            // >= 0
  double beta1 = 0.9;          // in [0, 1)
  double beta2 = 0.999;        // in [0, 1)
  double eps = 1e-8;           // > 0
  double weight_decay = 1e-2;  // >= 0
};

class AdamW : public Optimizer {
 public:
  // An AdamW over `params`, named "#0", "#1", ... in messages and state keys.
  // InvalidArgument naming the option for invalid options (see AdamWOptions; NaN and
  // infinities are invalid everywhere), and for a null or repeated parameter.
  static absl::StatusOr<std::unique_ptr<AdamW>> Create(std::vector<core::ParameterPtr> params,
                                                       const AdamWOptions& options = {});
  // The same, with the given names (for example Module::NamedParameters()).
  static absl::StatusOr<std::unique_ptr<AdamW>> Create(std::vector<core::NamedParameter> params,
                                                       const AdamWOptions& options = {});

  // One update of every parameter with requires_grad and a gradient; see Optimizer::Step.
  absl::Status Step() override;
  std::string TypeName() const override { return "AdamW"; }
  // {"exp_avg", "exp_avg_sq"}.
  std::vector<std::string> StateNames() const override { return {"exp_avg", "exp_avg_sq"}; }

  // The options given to Create; lr() (not options().lr) is the rate in use.
  const AdamWOptions& options() const { return options_; }

 private:
  AdamW(std::vector<core::NamedParameter> params, const AdamWOptions& options);

  AdamWOptions options_;
};

}  // namespace optim

#endif  // OPTIM_ADAMW_H_
