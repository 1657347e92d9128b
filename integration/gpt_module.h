// GptTrainModule: the GPT flavour of DecoderTrainModule (integration/decoder_module.h),
// the main job's default model and the one of the end-to-end tests: an nn::Gpt learning
// the synthetic Markov language (data/markov_language.h), or token files, with AdamW and
// a linear learning-rate warm-up.
//
//   integration::GptModuleOptions options;     // small GPT on a vocabulary of 64
//   ASSIGN_OR_RETURN(auto module, integration::GptTrainModule::Create(options));
//   ASSIGN_OR_RETURN(auto fit, runner->Fit(*module));
//   ASSIGN_OR_RETURN(auto test, runner->Test(*module));
//   // test.loss approaches module->EntropyFloor() as the model learns
//
// The batches, steps, loss and optimizer are DecoderTrainModule's (see there).
#ifndef INTEGRATION_GPT_MODULE_H_
#define INTEGRATION_GPT_MODULE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "integration/decoder_module.h"
#include "nn/gpt.h"

namespace integration {

struct GptModuleOptions : DecoderTrainOptions {
  nn::GptConfig model;  // vocab_size is also the language's (NOTE [Language vocabulary])
};

class GptTrainModule : public DecoderTrainModule {
 public:
  // The type of the GPT's repeated block (nn::TransformerBlock).
  static constexpr char kBlockType[] = "TransformerBlock";

  // InvalidArgument naming the option ("GptModuleOptions.seq_len", "GptConfig.n_head",
  // MarkovLanguageOptions...) for bad options.
  static absl::StatusOr<std::unique_ptr<GptTrainModule>> Create(const GptModuleOptions& options);

  // The DecoderSpec of an nn::Gpt with `config` (errors name GptModuleOptions and
  // GptConfig).
  static DecoderSpec Spec(const nn::GptConfig& config);

  const std::shared_ptr<nn::Gpt>& gpt() const { return gpt_; }
  const GptModuleOptions& options() const { return options_; }

 private:
  GptTrainModule() = default;

  GptModuleOptions options_;
  std::shared_ptr<nn::Gpt> gpt_;
};

}  // namespace integration

#endif  // INTEGRATION_GPT_MODULE_H_
