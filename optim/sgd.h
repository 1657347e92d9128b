// SGD: stochastic gradient descent with momentum, dampening, Nesterov momentum and L2
// weight decay, with torch.optim.SGD's exact update rule. For each parameter p with
// gradient g, at its t-th step (t counts only steps where p had a gradient):
//
//   g = g + weight_decay * p
//   if momentum != 0:
//     buf = g                                        (t == 1)
//     buf = momentum * buf + (1 - dampening) * g     (t > 1)
//     g = nesterov ? g + momentum * buf : buf
//   p = p - lr * g
//
//   optim::SgdOptions options;
//   options.lr = 0.1;
//   options.momentum = 0.9;
//   ASSIGN_OR_RETURN(std::unique_ptr<optim::SGD> sgd, optim::SGD::Create(params, options));
//   RETURN_IF_ERROR(sgd->Step());
//
// The momentum buffer ("momentum_buffer", float32, tag kOptim) is allocated at a
// parameter's first step; see NOTE [Optimizer and shards] in optim/optimizer.h.
#ifndef OPTIM_SGD_H_
#define OPTIM_SGD_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/parameter.h"
#include "optim/optimizer.h"

namespace optim {

// torch.optim.SGD's options with its defaults (lr as in PyTorch 2).
struct SgdOptions {
  double lr = 1e-3;           // >= 0
  double momentum = 0.0;      // >= 0
  double dampening = 0.0;     // any finite value, 0 with nesterov
  double weight_decay = 0.0;  // >= 0
  bool nesterov = false;      // needs momentum > 0 and dampening == 0
};

class SGD : public Optimizer {
 public:
  // An SGD over `params`, named "#0", "#1", ... in messages and state keys.
  // InvalidArgument naming the option for invalid options (see SgdOptions), and for a
  // null or repeated parameter.
  static absl::StatusOr<std::unique_ptr<SGD>> Create(std::vector<core::ParameterPtr> params,
                                                     const SgdOptions& options = {});
  // The same, with the given names (for example Module::NamedParameters()).
  static absl::StatusOr<std::unique_ptr<SGD>> Create(std::vector<core::NamedParameter> params,
                                                     const SgdOptions& options = {});

  // One update of every parameter with requires_grad and a gradient; see Optimizer::Step.
  absl::Status Step() override;
  std::string TypeName() const override { return "SGD"; }
  // {"momentum_buffer"} when momentum != 0, otherwise {}.
  std::vector<std::string> StateNames() const override;

  // The options given to Create; lr() (not options().lr) is the rate in use.
  const SgdOptions& options() const { return options_; }

 private:
  SGD(std::vector<core::NamedParameter> params, const SgdOptions& options);

  SgdOptions options_;
};

}  // namespace optim

#endif  // OPTIM_SGD_H_
