// Loads a transformers Llama directory into our Llama and exports it again in that layout
// (checkpoint/hf_llama.h); tools/hf/llama_testdata.py --check then loads the export with
// transformers and compares its logits.
//
//   bazel run //checkpoint:hf_llama_roundtrip -- --from=checkpoint/testdata/hf_llama --to=/tmp/out
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "checkpoint/hf_llama.h"

ABSL_FLAG(std::string, from, "",
          "a transformers Llama directory (config.json, model.safetensors or the index)");
ABSL_FLAG(std::string, to, "", "where to export it");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string from = absl::GetFlag(FLAGS_from), to = absl::GetFlag(FLAGS_to);
  if (from.empty() || to.empty()) {
    std::fprintf(stderr, "hf_llama_roundtrip: --from and --to are required\n");
    return 2;
  }
  absl::StatusOr<nn::LlamaConfig> config = checkpoint::ReadHfLlamaConfig(from);
  absl::StatusOr<std::shared_ptr<nn::Llama>> llama =
      config.ok() ? nn::Llama::Create(*config)
                  : absl::StatusOr<std::shared_ptr<nn::Llama>>(config.status());
  absl::Status s = llama.status();
  if (s.ok()) s = checkpoint::LoadHfLlama(from, **llama);
  if (s.ok()) s = checkpoint::ExportHfLlama(**llama, to);
  if (!s.ok()) {
    std::fprintf(stderr, "hf_llama_roundtrip: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("exported %s to %s\n", from.c_str(), to.c_str());
  return 0;
}
