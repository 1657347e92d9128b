// Fine-tunes a Hugging Face GPT-2 or Llama on token files with the stage API
// (examples/hf_stages.h) and exports the result for `transformers`:
//
//   python3 tools/hf/gpt2_testdata.py --vocab_size=256 --out=/tmp/tiny_gpt2   # or a real GPT-2
//   python3 tools/text_to_tokens.py --val_fraction=0.1 /usr/share/common-licenses/GPL-3 /tmp/gpl3
//   bazel run //examples:hf_stages -- --hf_dir=/tmp/tiny_gpt2 --data=/tmp/gpl3_train.bin \
//       --eval_data=/tmp/gpl3_val.bin --out_dir=/tmp/tiny_gpt2_tuned --world_size=2
//
// Without a launcher environment it starts --world_size local ranks (comm/launcher.h).
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "comm/rank_main.h"
#include "core/status_macros.h"
#include "examples/hf_stages.h"

ABSL_FLAG(std::string, hf_dir, "",
          "transformers GPT-2 or Llama directory (config.json, model.safetensors or its index)");
ABSL_FLAG(std::string, data, "", "training token file or directory of .bin shards");
ABSL_FLAG(std::string, eval_data, "", "test token file (default: --data)");
ABSL_FLAG(std::string, out_dir, "", "where rank 0 exports the trained model for transformers");
ABSL_FLAG(int64_t, steps, 50, "fit steps");
ABSL_FLAG(int, batch_size, 8, "sequences per global batch");
ABSL_FLAG(int, seq_len, 32, "tokens per sequence");
ABSL_FLAG(double, lr, 1e-3, "AdamW learning rate");
ABSL_FLAG(int, world_size, 2, "local ranks to start when no launcher started this process");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return comm::RankMain(
      "hf_stages", absl::GetFlag(FLAGS_world_size), argc, argv,
      [](const comm::Distributed& dist) -> absl::Status {
        examples::HfStagesOptions o;
        o.hf_dir = absl::GetFlag(FLAGS_hf_dir);
        o.data = absl::GetFlag(FLAGS_data);
        o.eval_data = absl::GetFlag(FLAGS_eval_data);
        o.out_dir = absl::GetFlag(FLAGS_out_dir);
        o.steps = absl::GetFlag(FLAGS_steps);
        o.batch_size = absl::GetFlag(FLAGS_batch_size);
        o.seq_len = absl::GetFlag(FLAGS_seq_len);
        o.lr = absl::GetFlag(FLAGS_lr);
        ASSIGN_OR_RETURN(examples::HfStagesResult r, examples::RunHfStages(dist.group, o));
        if (dist.group->rank() == 0) {
          std::printf(
              "%s: test loss %.4f as loaded; fit %.4f -> %.4f; test loss %.4f after; exported "
              "to %s\n",
              r.model_type.c_str(), r.test_loss_before, r.first_train_loss, r.final_train_loss,
              r.test_loss_after, o.out_dir.c_str());
        }
        return absl::OkStatus();
      });
}
