// Optimizer: the interface SGD and AdamW share, plus the bookkeeping they have in common
// (parameter names, per-parameter state allocated lazily, checkpoint access).
//
//   optim::AdamWOptions options;
//   options.lr = 3e-4;
//   ASSIGN_OR_RETURN(std::unique_ptr<optim::AdamW> opt,
//                    optim::AdamW::Create(model->NamedParameters(), options));
//   for (...) {
//     opt->ZeroGrad();
//     ... forward, backward (fills Parameter::grad) ...
//     RETURN_IF_ERROR(opt->Step());
//   }
//   for (const auto& [key, tensor] : opt->StateTensors()) ...  // "blocks.0.w.exp_avg", ...
//
// NOTE [Optimizer and shards]
// Updates are elementwise over each parameter's `data` and `grad` viewed flat, so an
// optimizer steps whatever `Parameter::data` points at when Step() runs: the full tensor,
// or the 1-D local slice FSDP leaves there between iterations. State tensors are
// allocated at a parameter's first step with the numel of its data at that moment. If a
// later Step finds a different numel (the optimizer stepped before the model was
// sharded), Step returns FailedPrecondition instead of guessing: build the optimizer
// after wrapping, or call ResetState().
//
// Thread compatibility: an Optimizer is not thread-safe; one thread steps it.
#ifndef OPTIM_OPTIMIZER_H_
#define OPTIM_OPTIMIZER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/parameter.h"
#include "core/tensor.h"

namespace optim {

// Everything an optimizer needs to resume exactly where it was; see Optimizer::State().
struct OptimizerState {
  // Number of successful Step() calls.
  int64_t step_count = 0;
  // "<parameter name>.<state name>" (for example "fc.weight.exp_avg") -> a tensor with the
  // numel of that parameter's data. Only parameters that have stepped appear.
  std::vector<std::pair<std::string, core::Tensor>> tensors;
  // "<parameter name>" -> how many steps that parameter has taken (a parameter without a
  // gradient is skipped and does not count). AdamW's bias correction uses it, as
  // PyTorch's per-parameter state['step'] does. Only parameters that have stepped appear.
  std::vector<std::pair<std::string, int64_t>> param_steps;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter that has requires_grad and a defined grad, from its grad.
  // All checks run before anything is modified, so on error no parameter or state has
  // changed. FailedPrecondition naming the parameter when its grad numel differs from
  // its data numel, or when its data numel differs from its state's (NOTE [Optimizer and
  // shards]); InvalidArgument for an lr() that is negative or not finite, for a
  // parameter that is not float32, or for one whose data and grad are on different
  // devices. Parameters may live on the CPU or on CUDA devices (state tensors are
  // allocated beside the data); on CUDA all parameters of one device are updated by one
  // fused kernel launch on the compute stream, asynchronously.
  virtual absl::Status Step() = 0;

  // "SGD" or "AdamW"; used in error messages.
  virtual std::string TypeName() const = 0;

  // The per-parameter state tensors this optimizer keeps, in the order StateTensors()
  // lists them: {"momentum_buffer"} for SGD with momentum, {} without it, {"exp_avg",
  // "exp_avg_sq"} for AdamW.
  virtual std::vector<std::string> StateNames() const = 0;

  // Zeroes every defined gradient of the managed parameters (frozen ones included), or
  // drops it (grad becomes undefined, so the next Step skips the parameter until a
  // backward fills it again) if `set_to_none`.
  void ZeroGrad(bool set_to_none = false);

  // The learning rate the next Step uses. set_lr never fails; Step rejects a bad value.
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }

  // Number of successful Step() calls (kept by ResetState, replaced by LoadState).
  int64_t step_count() const { return step_count_; }

  // The managed parameters with the names used in messages and state keys: the names
  // given to Create, or "#<index>" for the overload without names.
  const std::vector<core::NamedParameter>& named_parameters() const { return params_; }

  // The live state tensors (aliases, not copies; float32, tag kOptim), keyed
  // "<parameter name>.<state name>", in parameter order and StateNames() order. A
  // parameter that has not stepped yet has none.
  std::vector<std::pair<std::string, core::Tensor>> StateTensors() const;

  // step_count(), StateTensors() and the per-parameter step counts, for checkpoints.
  OptimizerState State() const;

  // Replaces all state with `state` (tensors are copied into new kOptim storage shaped
  // like each parameter's current data; bf16 sources are converted). A parameter listed
  // in state.param_steps with a positive count must have every StateNames() tensor; a
  // parameter not listed starts fresh. InvalidArgument naming the key for an unknown
  // name, a duplicate, a missing or superfluous tensor, or a numel that differs from the
  // parameter's data; nothing changes on error.
  absl::Status LoadState(const OptimizerState& state);

  // Drops every per-parameter state (tensors and per-parameter step counts), freeing its
  // memory, so each parameter's next step is its first. lr() and step_count() are kept.
  void ResetState();

 protected:
  struct ParamState {
    // Steps this parameter has taken, including the one in progress inside Step().
    int64_t steps = 0;
    // One tensor per StateNames() entry once the parameter has stepped.
    std::vector<core::Tensor> tensors;
  };

  // `params` must have passed ValidateParameters.
  Optimizer(std::vector<core::NamedParameter> params, double lr);

  // Names parameters "#0", "#1", ... in order.
  static std::vector<core::NamedParameter> NameByIndex(std::vector<core::ParameterPtr> params);

  // InvalidArgument for a null parameter, a parameter listed twice, or an empty or
  // duplicate name, naming `type_name` and the offending entries.
  static absl::Status ValidateParameters(const std::string& type_name,
                                         const std::vector<core::NamedParameter>& params);

  // The first half of every Step: checks lr and each parameter that will step (see
  // Step()), allocates zeroed state for parameters stepping for the first time, then
  // counts the step (step_count() and each stepping parameter's `steps`). Returns the
  // indices of the parameters to update; nothing is modified when it fails.
  absl::StatusOr<std::vector<size_t>> BeginStep();

  ParamState& state(size_t index) { return states_[index]; }
  const core::Parameter& param(size_t index) const { return *params_[index].second; }
  const std::string& param_name(size_t index) const { return params_[index].first; }

 private:
  std::vector<core::NamedParameter> params_;
  std::vector<ParamState> states_;
  double lr_;
  int64_t step_count_ = 0;
};

}  // namespace optim

#endif  // OPTIM_OPTIMIZER_H_
