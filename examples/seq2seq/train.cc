// Trains the encoder-decoder of examples/seq2seq on the reverse task through the stage API,
// on local ranks (or the ranks a launcher started), then releases it and writes what a user
// keeps (docs/MODELS.md walks through it):
//
//   bazel run //examples/seq2seq:train -- --world_size=2 --steps=300 --out_dir=/tmp/seq2seq
//
// <out_dir>/checkpoint: the training checkpoint (model and optimizer; loads at any world
// size); <out_dir>/model.safetensors: the released model's weights. Rank 0 prints the fit's
// losses, the validation and test losses, and how many held-out sequences the released
// model reverses exactly (greedy decoding).
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "checkpoint/safetensors.h"
#include "comm/rank_main.h"
#include "core/status_macros.h"
#include "examples/seq2seq/seq2seq_module.h"
#include "integration/stage_runner.h"

ABSL_FLAG(int, world_size, 2, "local ranks to start when no launcher started this process");
ABSL_FLAG(int64_t, steps, 300, "fit steps");
ABSL_FLAG(int, batch_size, 32, "sequences per global batch (a multiple of the world size)");
ABSL_FLAG(double, lr, 3e-3, "AdamW learning rate");
ABSL_FLAG(double, dropout, 0.0, "dropout rate of every residual branch");
ABSL_FLAG(std::string, out_dir, "/tmp/seq2seq", "where the checkpoint and the released model go");

namespace {

absl::Status Train(const std::shared_ptr<comm::ProcessGroup>& group) {
  seq2seq::Seq2SeqModuleOptions options;
  options.model.dropout = absl::GetFlag(FLAGS_dropout);
  options.optimizer.adamw.lr = absl::GetFlag(FLAGS_lr);
  ASSIGN_OR_RETURN(std::unique_ptr<seq2seq::Seq2SeqModule> module,
                   seq2seq::Seq2SeqModule::Create(options));

  integration::StageOptions stages;
  stages.wrap.policy = seq2seq::LayerPolicy();
  stages.fit_steps = absl::GetFlag(FLAGS_steps);
  stages.train_batch_size = absl::GetFlag(FLAGS_batch_size);
  stages.eval_batch_size = absl::GetFlag(FLAGS_batch_size);
  stages.eval_batches = 4;
  stages.log_every = 100;
  const std::string out_dir = absl::GetFlag(FLAGS_out_dir);
  stages.checkpoint_dir = out_dir + "/checkpoint";
  ASSIGN_OR_RETURN(auto runner, integration::StageRunner::Create(group, stages));

  const bool root = group->rank() == 0;
  ASSIGN_OR_RETURN(integration::FitResult fit, runner->Fit(*module));
  ASSIGN_OR_RETURN(integration::EvalResult validate, runner->Validate(*module));
  ASSIGN_OR_RETURN(integration::EvalResult test, runner->Test(*module));
  if (root) {
    std::printf("fit: %zu steps, loss %.4f -> %.4f; validate %.4f, test %.4f\n", fit.losses.size(),
                fit.losses.front(), fit.final_loss, validate.loss, test.loss);
  }
  RETURN_IF_ERROR(runner->Release(*module));  // every rank: the plain trained model
  if (!root) return absl::OkStatus();
  const std::string path = out_dir + "/model.safetensors";
  RETURN_IF_ERROR(checkpoint::ExportSafetensors(path, *module->model()));
  // The released model on held-out sequences (test batch indices, as the test stage).
  ASSIGN_OR_RETURN(seq2seq::ReverseTask task, seq2seq::ReverseTask::Create(options.task));
  ASSIGN_OR_RETURN(seq2seq::ReverseBatch held_out, task.Rows(3'000'000, 0, 64));
  auto& model = static_cast<seq2seq::Seq2Seq&>(*module->model());
  ASSIGN_OR_RETURN(int64_t exact, seq2seq::ExactlyReversed(model, held_out));
  std::printf("released: wrote %s; it reverses %lld of 64 held-out sequences exactly\n",
              path.c_str(), static_cast<long long>(exact));
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return comm::RankMain("train", absl::GetFlag(FLAGS_world_size), argc, argv,
                        [](const comm::Distributed& dist) { return Train(dist.group); });
}
