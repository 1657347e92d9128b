#include "integration/train_module.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "data/sampler.h"

namespace integration {

std::string StageName(Stage stage) {
  switch (stage) {
    case Stage::kFit:
      return "fit";
    case Stage::kValidate:
      return "validate";
    case Stage::kTest:
      return "test";
    case Stage::kPredict:
      return "predict";
  }
  return "unknown";
}

absl::StatusOr<std::pair<int64_t, int64_t>> StepRows(const StepContext& ctx) {
  if (ctx.micro_batches < 1 || ctx.micro_batch < 0 || ctx.micro_batch >= ctx.micro_batches ||
      ctx.batch_size % ctx.micro_batches != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StepRows: a batch of ", ctx.batch_size, " rows has no micro-batch ", ctx.micro_batch,
        " of ", ctx.micro_batches, " (need 0 <= micro_batch < micro_batches dividing the batch)"));
  }
  const int64_t micro_rows = ctx.batch_size / ctx.micro_batches;
  ASSIGN_OR_RETURN(data::RankSampler sampler, data::RankSampler::Create(ctx.rank, ctx.world_size));
  ASSIGN_OR_RETURN(auto rows, sampler.Rows(micro_rows));
  const int64_t first = ctx.micro_batch * micro_rows;
  return std::make_pair(first + rows.first, first + rows.second);
}

absl::StatusOr<double> ShareOfMean(const StepContext& ctx, int64_t local, int64_t global) {
  if (global <= 0 || local < 0 || local > global) {
    return absl::InvalidArgumentError(
        absl::StrCat("ShareOfMean: ", local, " local items of ", global,
                     " in the global batch (need 0 <= local <= global, global > 0)"));
  }
  const int64_t shares = static_cast<int64_t>(ctx.world_size) * ctx.micro_batches;
  return static_cast<double>(local) * static_cast<double>(shares) / static_cast<double>(global);
}

absl::StatusOr<core::Tensor> TrainModule::PredictStep(const StepContext& ctx) {
  std::shared_ptr<core::Module> m = model();
  return absl::UnimplementedError(absl::StrCat(
      "TrainModule::PredictStep is not implemented for ", m ? m->Describe() : "<no model>",
      " (batch ", ctx.step, "): override it to run the predict stage"));
}

}  // namespace integration
