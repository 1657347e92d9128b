// Loads a transformers GPT-2 directory into our Gpt and exports it again in that layout
// (checkpoint/hf_gpt2.h); tools/hf/gpt2_testdata.py --check then loads the export with
// transformers and compares its logits.
//
//   bazel run //checkpoint:hf_gpt2_roundtrip -- --from=checkpoint/testdata/hf_gpt2 --to=/tmp/out
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "checkpoint/hf_gpt2.h"

ABSL_FLAG(std::string, from, "", "a transformers GPT-2 directory (config.json, model.safetensors)");
ABSL_FLAG(std::string, to, "", "where to export it");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string from = absl::GetFlag(FLAGS_from), to = absl::GetFlag(FLAGS_to);
  if (from.empty() || to.empty()) {
    std::fprintf(stderr, "hf_gpt2_roundtrip: --from and --to are required\n");
    return 2;
  }
  absl::StatusOr<nn::GptConfig> config = checkpoint::ReadHfGpt2Config(from);
  absl::StatusOr<std::shared_ptr<nn::Gpt>> gpt =
      config.ok() ? nn::Gpt::Create(*config)
                  : absl::StatusOr<std::shared_ptr<nn::Gpt>>(config.status());
  absl::Status s = gpt.status();
  if (s.ok()) s = checkpoint::LoadHfGpt2(from, **gpt);
  if (s.ok()) s = checkpoint::ExportHfGpt2(**gpt, to);
  if (!s.ok()) {
    std::fprintf(stderr, "hf_gpt2_roundtrip: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("exported %s to %s\n", from.c_str(), to.c_str());
  return 0;
}
