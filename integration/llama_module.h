// LlamaTrainModule: the Llama flavour of DecoderTrainModule (integration/decoder_module.h):
// an nn::Llama (nn/llama.h) learning the synthetic Markov language, or token files, with
// the same batches, steps, loss, AdamW and warm-up as the GPT's GptTrainModule. The main
// job trains it with --model=llama.
//
//   integration::LlamaModuleOptions options;   // nn::LlamaConfig's small defaults
//   options.model.num_key_value_heads = 1;
//   ASSIGN_OR_RETURN(auto module, integration::LlamaTrainModule::Create(options));
//   ASSIGN_OR_RETURN(auto fit, runner->Fit(*module));  // one unit per LlamaDecoderLayer
#ifndef INTEGRATION_LLAMA_MODULE_H_
#define INTEGRATION_LLAMA_MODULE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "integration/decoder_module.h"
#include "nn/llama.h"

namespace integration {

struct LlamaModuleOptions : DecoderTrainOptions {
  // vocab_size is also the language's (NOTE [Language vocabulary]); seq_len is at most
  // max_position_embeddings.
  nn::LlamaConfig model;
};

class LlamaTrainModule : public DecoderTrainModule {
 public:
  // The type of the Llama's repeated block (nn::LlamaDecoderLayer).
  static constexpr char kBlockType[] = "LlamaDecoderLayer";

  // InvalidArgument naming the option ("LlamaModuleOptions.seq_len",
  // "LlamaConfig.num_key_value_heads" from LlamaConfig::Validate, ...) for bad options.
  static absl::StatusOr<std::unique_ptr<LlamaTrainModule>> Create(
      const LlamaModuleOptions& options);

  // The DecoderSpec of an nn::Llama with `config` (errors name LlamaModuleOptions and
  // LlamaConfig).
  static DecoderSpec Spec(const nn::LlamaConfig& config);

  const std::shared_ptr<nn::Llama>& llama() const { return llama_; }
  const LlamaModuleOptions& options() const { return options_; }

 private:
  LlamaTrainModule() = default;

  LlamaModuleOptions options_;
  std::shared_ptr<nn::Llama> llama_;
};

}  // namespace integration

#endif  // INTEGRATION_LLAMA_MODULE_H_
