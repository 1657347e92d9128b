// The consumer's own model and TrainModule, written as graph modules (NOTE [Graph modules]
// in core/module.h): only forwards, no hand-written backward. An Mlp is MlpBlocks
// (Linear + the consumer's own SquaredRelu op, squared_relu.h) and a Linear head, trained on
// data::RegressionTask with a mean squared error: the training step is
// F::Mse(mlp->CallOne({x}), y) then core::Backward(loss), and the autograd graph
// differentiates it. Nothing here is a GPT; the StageRunner drives it like any TrainModule.
//
//   ASSIGN_OR_RETURN(auto module, consumer::RegressionModule::Create({}));
//   ASSIGN_OR_RETURN(auto runner, integration::StageRunner::Create(group, options));
//   ASSIGN_OR_RETURN(integration::FitResult fit, runner->Fit(*module));
#ifndef EXAMPLES_CONSUMER_MLP_H_
#define EXAMPLES_CONSUMER_MLP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/parameter.h"
#include "core/tensor.h"
#include "data/regression.h"
#include "integration/train_module.h"
#include "nn/linear.h"
#include "optim/adamw.h"

namespace consumer {

// y = SquaredRelu(x W^T + b): x [..., in] -> y [..., out]. The unit the "mlp_blocks" policy
// wraps. Parameters "weight" [out, in] and "bias" [out] hold, from `seed`, the values an
// nn::Linear(in, out, true, seed) starts with (U(-1/sqrt(in), 1/sqrt(in)), the bias drawing
// after the weight), recorded as core::ParamInit recipes so deferred initialisation gives
// the same values.
class MlpBlock : public core::Module {
 public:
  MlpBlock(int64_t in, int64_t out, uint64_t seed);
  std::string TypeName() const override { return "MlpBlock"; }

 protected:
  // {x} -> {y}; InvalidArgument naming the block for another number of inputs, and the
  // ops' errors ("Linear: ...", "SquaredRelu: ...") for a wrong x.
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& inputs) override;

 private:
  core::ParameterPtr weight_;
  core::ParameterPtr bias_;
};

// sizes[0] -> sizes[1] -> ... -> sizes[n-2] in MlpBlocks "block0", "block1", ..., then an
// nn::Linear "head" to sizes[n-1], called from the graph (its own backward runs as one
// node). Call it with one input: mlp->CallOne({x}).
class Mlp : public core::Module {
 public:
  // InvalidArgument naming `sizes` for fewer than 2 sizes or a size below 1; the first
  // parameter allocation that failed (ConstructionStatus()) for sizes too large.
  static absl::StatusOr<std::shared_ptr<Mlp>> Create(const std::vector<int64_t>& sizes,
                                                     uint64_t seed);
  std::string TypeName() const override { return "Mlp"; }

 protected:
  // {x [..., sizes[0]]} -> {[..., sizes[n-1]]}; InvalidArgument naming the Mlp for another
  // number of inputs.
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& inputs) override;

 private:
  Mlp() = default;
  std::vector<std::shared_ptr<MlpBlock>> blocks_;
  std::shared_ptr<nn::Linear> head_;
};

struct RegressionModuleOptions {
  int in_features = 8;
  int hidden = 32;
  int blocks = 2;
  int out_features = 4;
  uint64_t seed = 1;
  optim::AdamWOptions adamw = [] {
    optim::AdamWOptions o;
    o.lr = 1e-2;
    o.weight_decay = 0;
    return o;
  }();
};

// Fits the MLP to a RegressionTask (y = W x + b): training batches are the task's
// batches 0, 1, ...; validation and test batches come from far-away indices, so they are
// held out. A training step is forward (CallOne), nn::functional::Mse and core::Backward;
// an evaluation step is the forward and the loss only (the runner runs it under
// core::NoGradScope, so nothing is recorded). StepOutput::count is the number of samples
// (rows), so progress lines say samples/s.
class RegressionModule : public integration::TrainModule {
 public:
  static absl::StatusOr<std::unique_ptr<RegressionModule>> Create(
      const RegressionModuleOptions& options);

  std::shared_ptr<core::Module> model() override { return mlp_; }
  absl::StatusOr<integration::StepOutput> TrainingStep(
      const integration::StepContext& ctx) override;
  absl::StatusOr<integration::StepOutput> EvaluationStep(
      const integration::StepContext& ctx) override;
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> ConfigureOptimizer(
      std::vector<core::NamedParameter> params) override;

 private:
  RegressionModule(RegressionModuleOptions options, data::RegressionTask task,
                   std::shared_ptr<Mlp> mlp)
      : options_(options), task_(std::move(task)), mlp_(std::move(mlp)) {}
  // This rank's rows of batch `index`.
  absl::StatusOr<data::RegressionBatch> LocalBatch(int64_t index,
                                                   const integration::StepContext& ctx) const;

  RegressionModuleOptions options_;
  data::RegressionTask task_;
  std::shared_ptr<Mlp> mlp_;
};

}  // namespace consumer

#endif  // EXAMPLES_CONSUMER_MLP_H_
