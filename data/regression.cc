#include "data/regression.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "core/status_macros.h"

namespace data {
namespace {

constexpr int kMaxFeatures = 65536;
constexpr uint64_t kParameterStream = 0;
constexpr uint64_t kSampleStream = 1;

}  // namespace

absl::StatusOr<RegressionTask> RegressionTask::Create(const RegressionOptions& options) {
  if (options.in_features < 1 || options.in_features > kMaxFeatures) {
    return absl::InvalidArgumentError(
        absl::StrCat("RegressionTask: RegressionOptions.in_features is ", options.in_features,
                     "; it must be in [1, ", kMaxFeatures, "]"));
  }
  if (options.out_features < 1 || options.out_features > kMaxFeatures) {
    return absl::InvalidArgumentError(
        absl::StrCat("RegressionTask: RegressionOptions.out_features is ", options.out_features,
                     "; it must be in [1, ", kMaxFeatures, "]"));
  }
  RegressionTask task;
  task.options_ = options;
  const int64_t in = options.in_features;
  const int64_t out = options.out_features;
  ASSIGN_OR_RETURN(task.weight_, core::Tensor::Allocate({out, in}));
  ASSIGN_OR_RETURN(task.bias_, core::Tensor::Allocate({out}));
  core::Rng rng = core::Rng(options.seed).Fork(kParameterStream);
  const float w_std = static_cast<float>(1.0 / std::sqrt(static_cast<double>(in)));
  float* w = task.weight_.data<float>();
  for (int64_t i = 0; i < out * in; ++i) w[i] = rng.Normal(0.0f, w_std);
  float* b = task.bias_.data<float>();
  for (int64_t i = 0; i < out; ++i) b[i] = rng.Normal(0.0f, 0.5f);
  return task;
}

absl::StatusOr<RegressionBatch> RegressionTask::Batch(int64_t index, int batch_size) const {
  if (index < 0 || batch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("RegressionTask::Batch: index ", index,
                                                   ", batch_size ", batch_size,
                                                   "; need index >= 0 and batch_size >= 1"));
  }
  const int64_t rows = batch_size;
  const int64_t in = options_.in_features;
  const int64_t out = options_.out_features;
  ASSIGN_OR_RETURN(core::Tensor inputs, core::Tensor::Allocate({rows, in}));
  ASSIGN_OR_RETURN(core::Tensor targets, core::Tensor::Allocate({rows, out}));
  const core::Rng batch_rng =
      core::Rng(options_.seed).Fork(kSampleStream).Fork(static_cast<uint64_t>(index));
  const float* w = weight_.data<float>();
  const float* b = bias_.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    core::Rng rng = batch_rng.Fork(static_cast<uint64_t>(r));
    float* x = inputs.data<float>() + r * in;
    for (int64_t i = 0; i < in; ++i) x[i] = rng.Normal(0.0f, 1.0f);
    float* y = targets.data<float>() + r * out;
    for (int64_t o = 0; o < out; ++o) {
      double acc = b[o];
      for (int64_t i = 0; i < in; ++i) acc += static_cast<double>(w[o * in + i]) * x[i];
      y[o] = static_cast<float>(acc);
    }
  }
  return RegressionBatch{std::move(inputs), std::move(targets)};
}

}  // namespace data
