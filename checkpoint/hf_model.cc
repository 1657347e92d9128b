#include "checkpoint/hf_model.h"

#include "absl/strings/str_cat.h"
#include "checkpoint/hf_gpt2.h"
#include "checkpoint/hf_llama.h"
#include "checkpoint/internal/hf_common.h"
#include "core/status_macros.h"
#include "nn/gpt.h"
#include "nn/llama.h"

namespace checkpoint {
namespace {

constexpr char kWhich[] = "this library computes gpt2 (nn::Gpt) and llama (nn::Llama)";

absl::Status NeitherFamily(const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": the model is neither an nn::Gpt nor an nn::Llama; ", kWhich));
}

}  // namespace

const char* HfModelTypeName(HfModelType type) {
  return type == HfModelType::kGpt2 ? "gpt2" : "llama";
}

absl::StatusOr<HfModelType> ReadHfModelType(const std::string& dir) {
  const std::string path = dir + "/config.json";
  ASSIGN_OR_RETURN(const internal::Json json, internal::ReadJson(path, "transformers config"));
  const auto it = json.find("model_type");
  if (it == json.end()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no model_type; ", kWhich));
  }
  if (*it == "gpt2") return HfModelType::kGpt2;
  if (*it == "llama") return HfModelType::kLlama;
  return absl::InvalidArgumentError(absl::StrCat(path, ": model_type ", it->dump(), ": ", kWhich));
}

absl::Status LoadHfModel(const std::string& dir, core::Module& model,
                         fsdp::WrapperRegistry* registry) {
  const std::string where = absl::StrCat("LoadHfModel(", dir, ")");
  auto* gpt = dynamic_cast<nn::Gpt*>(&model);
  auto* llama = dynamic_cast<nn::Llama*>(&model);
  if (gpt == nullptr && llama == nullptr) return NeitherFamily(where);
  ASSIGN_OR_RETURN(const HfModelType type, ReadHfModelType(dir));
  const HfModelType want = gpt != nullptr ? HfModelType::kGpt2 : HfModelType::kLlama;
  if (type != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": config.json's model_type is ", HfModelTypeName(type), " but the model is an nn::",
        gpt != nullptr ? "Gpt" : "Llama", " (", HfModelTypeName(want), ")"));
  }
  if (gpt != nullptr) {
    return registry != nullptr ? LoadHfGpt2(dir, *gpt, registry) : LoadHfGpt2(dir, *gpt);
  }
  return registry != nullptr ? LoadHfLlama(dir, *llama, registry) : LoadHfLlama(dir, *llama);
}

absl::Status ExportHfModel(const core::Module& model, const std::string& dir) {
  if (const auto* gpt = dynamic_cast<const nn::Gpt*>(&model); gpt != nullptr) {
    return ExportHfGpt2(*gpt, dir);
  }
  if (const auto* llama = dynamic_cast<const nn::Llama*>(&model); llama != nullptr) {
    return ExportHfLlama(*llama, dir);
  }
  return NeitherFamily(absl::StrCat("ExportHfModel(", dir, ")"));
}

}  // namespace checkpoint
