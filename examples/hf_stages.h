// The stage API end to end on a Hugging Face model, GPT-2 or Llama: fit starting from a
// `transformers` checkpoint, test on a token file, release, export in the Hugging Face
// layout.
//
//   examples::HfStagesOptions o;
//   o.hf_dir = "/models/llama";                // config.json + model.safetensors (or index)
//   o.data = "/data/train.bin";                 // llm.c / nanoGPT token files
//   o.eval_data = "/data/val.bin";
//   o.out_dir = "/out/llama-tuned";             // transformers loads it
//   ASSIGN_OR_RETURN(examples::HfStagesResult r, examples::RunHfStages(group, o));
//
// config.json's model_type picks the family ("gpt2": nn::Gpt, checkpoint/hf_gpt2.h;
// "llama": nn::Llama, checkpoint/hf_llama.h). On every rank of `group`: the model is built
// deferred (no parameter memory), wrapped (each repeated block a unit), and the checkpoint
// is loaded straight into this rank's shards (with the registry); Fit trains on the token
// file, Test measures the held-out loss, Release hands back the plain trained model and
// rank 0 exports it. bazel run //examples:hf_stages runs it on local ranks.
#ifndef EXAMPLES_HF_STAGES_H_
#define EXAMPLES_HF_STAGES_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "comm/process_group.h"

namespace examples {

struct HfStagesOptions {
  std::string hf_dir;
  std::string data;
  std::string eval_data;  // "" : the training files
  std::string out_dir;
  int64_t steps = 50;
  int batch_size = 8;  // sequences per global batch, a multiple of the world size
  int seq_len = 32;    // at most the model's longest sequence
  double lr = 1e-3;
};

struct HfStagesResult {
  std::string model_type;       // config.json's: "gpt2" or "llama"
  double test_loss_before = 0;  // the checkpoint as loaded
  double first_train_loss = 0;
  double final_train_loss = 0;
  double test_loss_after = 0;
};

// InvalidArgument naming config.json and its model_type for another family
// (checkpoint::ReadHfModelType); the checkpoint readers' and the stages' errors otherwise.
absl::StatusOr<HfStagesResult> RunHfStages(const std::shared_ptr<comm::ProcessGroup>& group,
                                           const HfStagesOptions& options);

}  // namespace examples

#endif  // EXAMPLES_HF_STAGES_H_
