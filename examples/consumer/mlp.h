// The consumer's own model and TrainModule: an MLP of MlpBlocks (Linear + ReLU) and a
// Linear head, trained on data::RegressionTask with a mean squared error. Nothing here
// is a GPT; the StageRunner drives it like any TrainModule.
//
//   ASSIGN_OR_RETURN(auto module, consumer::RegressionModule::Create({}));
//   ASSIGN_OR_RETURN(auto runner, integration::StageRunner::Create(group, options));
//   ASSIGN_OR_RETURN(integration::FitResult fit, runner->Fit(*module));
#ifndef EXAMPLES_CONSUMER_MLP_H_
#define EXAMPLES_CONSUMER_MLP_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/tensor.h"
#include "data/regression.h"
#include "integration/train_module.h"
#include "nn/activations.h"
#include "nn/linear.h"
#include "optim/adamw.h"

namespace consumer {

// Linear(in, out) then ReLU: the unit the "mlp_blocks" policy wraps.
class MlpBlock : public core::Module {
 public:
  MlpBlock(int64_t in, int64_t out, uint64_t seed);
  std::string TypeName() const override { return "MlpBlock"; }

 protected:
  absl::StatusOr<core::Tensor> ForwardImpl(const core::Tensor& x) override;
  absl::StatusOr<core::Tensor> BackwardImpl(const core::Tensor& grad_output) override;

 private:
  std::shared_ptr<nn::Linear> fc_;
  std::shared_ptr<nn::ReLU> act_;
};

// sizes[0] -> sizes[1] -> ... -> sizes[n-2] in MlpBlocks "block0", "block1", ..., then a
// Linear "head" to sizes[n-1].
class Mlp : public core::Module {
 public:
  // InvalidArgument naming `sizes` for fewer than 2 sizes or a size below 1.
  static absl::StatusOr<std::shared_ptr<Mlp>> Create(const std::vector<int64_t>& sizes,
                                                     uint64_t seed);
  std::string TypeName() const override { return "Mlp"; }

 protected:
  absl::StatusOr<core::Tensor> ForwardImpl(const core::Tensor& x) override;
  absl::StatusOr<core::Tensor> BackwardImpl(const core::Tensor& grad_output) override;

 private:
  Mlp() = default;
  std::vector<std::shared_ptr<core::Module>> layers_;
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
// held out. StepOutput::count is the number of samples (rows), so progress lines say
// samples/s.
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
