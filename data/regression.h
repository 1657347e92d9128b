// RegressionTask: a small deterministic linear regression problem, y = W x + b, with a
// fixed random W [out, in] and b [out] and inputs x ~ N(0, 1). The targets are exact (no
// noise), so a Linear layer can reach zero loss; tests and examples use it to check that
// training on N ranks matches training on one.
//
//   data::RegressionOptions options;
//   options.in_features = 8;
//   options.out_features = 4;
//   ASSIGN_OR_RETURN(data::RegressionTask task, data::RegressionTask::Create(options));
//   ASSIGN_OR_RETURN(data::RegressionBatch batch, task.Batch(/*index=*/step, 16));
//   // batch.inputs: float32 [16, 8], batch.targets: float32 [16, 4]
#ifndef DATA_REGRESSION_H_
#define DATA_REGRESSION_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace data {

struct RegressionOptions {
  int in_features = 8;   // in [1, 65536]
  int out_features = 4;  // in [1, 65536]
  uint64_t seed = 0;
};

// Inputs float32 [B, in] and targets float32 [B, out] with targets = inputs W^T + b.
struct RegressionBatch {
  core::Tensor inputs;
  core::Tensor targets;
};

class RegressionTask {
 public:
  // Draws W with entries N(0, 1 / in_features) (so each target has variance about 1
  // before the bias) and b with entries N(0, 0.25), from `seed`. InvalidArgument naming
  // the option for features out of range.
  static absl::StatusOr<RegressionTask> Create(const RegressionOptions& options);

  const RegressionOptions& options() const { return options_; }
  int in_features() const { return options_.in_features; }
  int out_features() const { return options_.out_features; }

  // The true weight [out, in] and bias [out] (float32; read them, do not modify them).
  const core::Tensor& weight() const { return weight_; }
  const core::Tensor& bias() const { return bias_; }

  // Batch number `index` (>= 0) of `batch_size` (>= 1) rows. Row r depends only on
  // (seed, index, r): the same index gives the same batch on every rank and in any call
  // order. Targets are computed in double and rounded to float32 once.
  // InvalidArgument for a negative index or a batch_size < 1.
  absl::StatusOr<RegressionBatch> Batch(int64_t index, int batch_size) const;

 private:
  RegressionTask() = default;

  RegressionOptions options_;
  core::Tensor weight_;
  core::Tensor bias_;
};

}  // namespace data

#endif  // DATA_REGRESSION_H_
