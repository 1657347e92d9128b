#include "integration/gpt_module.h"

#include <memory>
#include <utility>

#include "core/status_macros.h"

namespace integration {

DecoderSpec GptTrainModule::Spec(const nn::GptConfig& config) {
  DecoderSpec spec;
  spec.options_name = "GptModuleOptions";
  spec.max_seq_len_name = "GptConfig.block_size";
  spec.vocab_size = config.vocab_size;
  spec.max_seq_len = config.block_size;
  spec.block_type = kBlockType;
  spec.num_layers = config.n_layer;
  spec.hidden_size = config.n_embd;
  SetDecoderModel<nn::Gpt>(config, &spec);
  return spec;
}

absl::StatusOr<std::unique_ptr<GptTrainModule>> GptTrainModule::Create(
    const GptModuleOptions& options) {
  std::unique_ptr<GptTrainModule> module(new GptTrainModule());
  RETURN_IF_ERROR(module->Init(options, Spec(options.model)));
  module->options_ = options;
  module->gpt_ = std::static_pointer_cast<nn::Gpt>(module->model());
  return module;
}

}  // namespace integration
