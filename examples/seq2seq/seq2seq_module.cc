#include "examples/seq2seq/seq2seq_module.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "core/status_macros.h"
#include "nn/functional/elementwise.h"
#include "nn/functional/loss.h"

namespace seq2seq {
namespace {

namespace F = ::nn::functional;

constexpr int64_t kValidateBatches = 1'000'000;
constexpr int64_t kTestBatches = 2'000'000;

}  // namespace

absl::StatusOr<std::unique_ptr<Seq2SeqModule>> Seq2SeqModule::Create(
    const Seq2SeqModuleOptions& options) {
  const Seq2SeqConfig& m = options.model;
  if (m.vocab < 1 || m.width < 1 || m.heads < 1 || m.width % m.heads != 0 || m.hidden < 1 ||
      m.encoder_layers < 0 || m.decoder_layers < 0 || m.max_positions < 1 ||
      !(m.dropout >= 0 && m.dropout < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Seq2SeqModuleOptions.model: vocab ", m.vocab, ", width ", m.width, ", heads ", m.heads,
        ", hidden ", m.hidden, ", max_positions ", m.max_positions, ", dropout ", m.dropout,
        " (need positive sizes, heads dividing width, dropout in [0, 1))"));
  }
  if (options.task.vocab != m.vocab) {
    return absl::InvalidArgumentError(absl::StrCat("Seq2SeqModuleOptions.task.vocab (",
                                                   options.task.vocab, ") != model.vocab (",
                                                   m.vocab, ")"));
  }
  if (options.task.max_symbols + 1 > m.max_positions) {
    return absl::InvalidArgumentError(
        absl::StrCat("Seq2SeqModuleOptions.task.max_symbols (", options.task.max_symbols,
                     ") + 1 exceeds model.max_positions (", m.max_positions, ")"));
  }
  ASSIGN_OR_RETURN(ReverseTask task, ReverseTask::Create(options.task));
  std::unique_ptr<Seq2SeqModule> module(new Seq2SeqModule(options, std::move(task)));
  RETURN_IF_ERROR(module->model_->ConstructionStatus());
  return module;
}

absl::StatusOr<integration::StepOutput> Seq2SeqModule::TrainingStep(
    const integration::StepContext& ctx) {
  ASSIGN_OR_RETURN(auto rows, integration::StepRows(ctx));
  ASSIGN_OR_RETURN(ReverseBatch batch, task_.Rows(ctx.step, rows.first, rows.second));
  model_->SetDropoutStep({/*training=*/true, static_cast<uint64_t>(ctx.step), rows.first});
  ASSIGN_OR_RETURN(core::Tensor loss,
                   F::CrossEntropy(model_->CallOne({batch.src, batch.src_mask, batch.tgt}),
                                   batch.labels, kIgnore));
  const double mean = loss.ToVector()[0];
  // NOTE [Mean over real tokens]: the global batch's mean at every world size.
  ASSIGN_OR_RETURN(double share, integration::ShareOfMean(
                                     ctx, batch.tokens, task_.Tokens(ctx.step, 0, ctx.batch_size)));
  ASSIGN_OR_RETURN(core::Tensor scaled, F::MulScalar(loss, static_cast<float>(share)));
  RETURN_IF_ERROR(core::Backward(scaled));
  return integration::StepOutput{mean, batch.tokens};
}

absl::StatusOr<integration::StepOutput> Seq2SeqModule::EvaluationStep(
    const integration::StepContext& ctx) {
  const int64_t index =
      (ctx.stage == integration::Stage::kTest ? kTestBatches : kValidateBatches) + ctx.step;
  ASSIGN_OR_RETURN(auto rows, integration::StepRows(ctx));
  ASSIGN_OR_RETURN(ReverseBatch batch, task_.Rows(index, rows.first, rows.second));
  model_->SetDropoutStep({});
  ASSIGN_OR_RETURN(core::Tensor loss,
                   F::CrossEntropy(model_->CallOne({batch.src, batch.src_mask, batch.tgt}),
                                   batch.labels, kIgnore));
  return integration::StepOutput{loss.ToVector()[0], batch.tokens};
}

absl::StatusOr<std::unique_ptr<optim::Optimizer>> Seq2SeqModule::ConfigureOptimizer(
    std::vector<core::NamedParameter> params) {
  return optim::MakeOptimizer(std::move(params), options_.optimizer);
}

absl::StatusOr<std::vector<std::vector<int32_t>>> GreedyAnswers(Seq2Seq& model,
                                                                const ReverseBatch& batch) {
  core::NoGradScope no_grad;
  const int64_t rows = batch.tgt.size(0), t = batch.tgt.size(1);
  const int64_t vocab = model.config().vocab;
  std::vector<int32_t> tgt(rows * t, kPad);
  for (int64_t r = 0; r < rows; ++r) tgt[r * t] = kBos;
  for (int64_t j = 0; j < t; ++j) {
    // Causal: position j sees positions 0 .. j only, so the padding after j changes nothing.
    ASSIGN_OR_RETURN(core::Tensor ids, core::Tensor::FromInts(tgt, {rows, t}));
    ASSIGN_OR_RETURN(core::Tensor logits, model.CallOne({batch.src, batch.src_mask, ids}));
    const std::vector<float> l = logits.ToVector();
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = l.data() + (r * t + j) * vocab;
      const int32_t next = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      if (j + 1 < t) tgt[r * t + j + 1] = next;
      if (j + 1 == t) tgt.push_back(next);  // the last position's answer, kept below
    }
  }
  std::vector<std::vector<int32_t>> answers(rows);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 1; j <= t; ++j) {
      const int32_t token = j < t ? tgt[r * t + j] : tgt[rows * t + r];
      if (token == kEos) break;
      answers[r].push_back(token);
    }
  }
  return answers;
}

absl::StatusOr<int64_t> ExactlyReversed(Seq2Seq& model, const ReverseBatch& batch) {
  ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> answers, GreedyAnswers(model, batch));
  const std::vector<float> labels = batch.labels.ToVector();
  const int64_t t = batch.labels.size(1);
  int64_t exact = 0;
  for (size_t r = 0; r < answers.size(); ++r) {
    std::vector<int32_t> want;
    for (int64_t j = 0; j < t && labels[r * t + j] != kEos; ++j) {
      want.push_back(static_cast<int32_t>(labels[r * t + j]));
    }
    exact += answers[r] == want;
  }
  return exact;
}

policy::WrapPolicyPtr LayerPolicy() {
  return policy::ModuleTypes({"EncoderLayer", "DecoderLayer"});
}

}  // namespace seq2seq
