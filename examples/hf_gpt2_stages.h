// The stage API end to end on a Hugging Face GPT-2: fit starting from a `transformers`
// checkpoint, test on a token file, release, export in the Hugging Face layout.
//
//   examples::HfGpt2StagesOptions o;
//   o.hf_dir = "/models/gpt2";                 // config.json + model.safetensors
//   o.data = "/data/train.bin";                 // llm.c / nanoGPT token files
//   o.eval_data = "/data/val.bin";
//   o.out_dir = "/out/gpt2-tuned";              // transformers loads it
//   ASSIGN_OR_RETURN(examples::HfGpt2StagesResult r, examples::RunHfGpt2Stages(group, o));
//
// On every rank of `group`: the GPT is built deferred (no parameter memory), wrapped (each
// TransformerBlock a unit), and the checkpoint is loaded straight into this rank's shards
// (checkpoint::LoadHfGpt2 with the registry); Fit trains on the token file, Test measures
// the held-out loss, Release hands back the plain trained model and rank 0 exports it
// (checkpoint::ExportHfGpt2). bazel run //examples:hf_gpt2_stages runs it on local ranks.
#ifndef EXAMPLES_HF_GPT2_STAGES_H_
#define EXAMPLES_HF_GPT2_STAGES_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "comm/process_group.h"

namespace examples {

struct HfGpt2StagesOptions {
  std::string hf_dir;
  std::string data;
  std::string eval_data;  // "" : the training files
  std::string out_dir;
  int64_t steps = 50;
  int batch_size = 8;  // sequences per global batch, a multiple of the world size
  int seq_len = 32;    // at most the model's n_positions
  double lr = 1e-3;
};

struct HfGpt2StagesResult {
  double test_loss_before = 0;  // the checkpoint as loaded
  double first_train_loss = 0;
  double final_train_loss = 0;
  double test_loss_after = 0;
};

absl::StatusOr<HfGpt2StagesResult> RunHfGpt2Stages(
    const std::shared_ptr<comm::ProcessGroup>& group, const HfGpt2StagesOptions& options);

}  // namespace examples

#endif  // EXAMPLES_HF_GPT2_STAGES_H_
