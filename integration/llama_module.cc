#include "integration/llama_module.h"

#include <memory>
#include <utility>

#include "core/status_macros.h"

namespace integration {

DecoderSpec LlamaTrainModule::Spec(const nn::LlamaConfig& config) {
  DecoderSpec spec;
  spec.options_name = "LlamaModuleOptions";
  spec.max_seq_len_name = "LlamaConfig.max_position_embeddings";
  spec.vocab_size = config.vocab_size;
  spec.max_seq_len = config.max_position_embeddings;
  spec.block_type = kBlockType;
  spec.num_layers = config.num_hidden_layers;
  spec.hidden_size = config.hidden_size;
  SetDecoderModel<nn::Llama>(config, &spec);
  return spec;
}

absl::StatusOr<std::unique_ptr<LlamaTrainModule>> LlamaTrainModule::Create(
    const LlamaModuleOptions& options) {
  // The config first, so that a bad one is named by LlamaConfig::Validate rather than by
  // the seq_len check against its max_position_embeddings.
  RETURN_IF_ERROR(options.model.Validate());
  std::unique_ptr<LlamaTrainModule> module(new LlamaTrainModule());
  RETURN_IF_ERROR(module->Init(options, Spec(options.model)));
  module->options_ = options;
  module->llama_ = std::static_pointer_cast<nn::Llama>(module->model());
  return module;
}

}  // namespace integration
