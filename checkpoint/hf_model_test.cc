// checkpoint/hf_model.h on the committed transformers checkpoints (checkpoint/testdata):
// config.json's model_type picks the family, another or none is refused naming it, and
// the loader and exporter dispatch on the model: each loads what the family's own loader
// loads and exports what it exports; a model of neither family, or of the other one, is
// refused.
#include "checkpoint/hf_model.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "checkpoint/hf_gpt2.h"
#include "checkpoint/hf_llama.h"
#include "checkpoint/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/linear.h"

namespace checkpoint {
namespace {

using ::testing::HasSubstr;

const char kGpt2[] = "checkpoint/testdata/hf_gpt2";
const char kLlama[] = "checkpoint/testdata/hf_llama";

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// A directory holding only a config.json with `text`.
std::string ConfigDir(const std::string& name, const std::string& text) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << text;
  return dir;
}

// Every parameter of `a` equals `b`'s of the same name, bit for bit.
void ExpectSameParameters(const core::Module& a, const core::Module& b) {
  const auto pa = a.NamedParameters();
  const auto pb = b.NamedParameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first);
    EXPECT_EQ(pa[i].second->data.ToVector(), pb[i].second->data.ToVector()) << pa[i].first;
  }
}

TEST(HfModelTest, ReadsTheModelType) {
  EXPECT_EQ(ReadHfModelType(kGpt2).value(), HfModelType::kGpt2);
  EXPECT_EQ(ReadHfModelType(kLlama).value(), HfModelType::kLlama);
  EXPECT_STREQ(HfModelTypeName(HfModelType::kGpt2), "gpt2");
  EXPECT_STREQ(HfModelTypeName(HfModelType::kLlama), "llama");
}

TEST(HfModelTest, AnotherOrNoModelTypeIsRefusedNamingTheFile) {
  const std::string bert = ConfigDir("bert", R"({"model_type": "bert"})");
  absl::Status s = ReadHfModelType(bert).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr(bert + "/config.json: model_type \"bert\""));
  const std::string none = ConfigDir("no_type", R"({"n_embd": 32})");
  s = ReadHfModelType(none).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr(none + "/config.json: no model_type"));
  s = ReadHfModelType(::testing::TempDir() + "/nowhere").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(Message(s), HasSubstr("nowhere/config.json"));
}

TEST(HfModelTest, LoadsAndExportsEitherFamilyAsItsOwnFunctionsDo) {
  // GPT-2: LoadHfModel gives LoadHfGpt2's weights; the export loads back to the same.
  {
    const nn::GptConfig config = ReadHfGpt2Config(kGpt2).value();
    std::shared_ptr<nn::Gpt> a = nn::Gpt::Create(config).value();
    std::shared_ptr<nn::Gpt> b = nn::Gpt::Create(config).value();
    ASSERT_TRUE(LoadHfGpt2(kGpt2, *a).ok());
    const absl::Status loaded = LoadHfModel(kGpt2, *b, /*registry=*/nullptr);
    ASSERT_TRUE(loaded.ok()) << loaded;
    ExpectSameParameters(*a, *b);
    const std::string out = ::testing::TempDir() + "/gpt2_export";
    ASSERT_TRUE(ExportHfModel(*b, out).ok());
    EXPECT_EQ(ReadHfModelType(out).value(), HfModelType::kGpt2);
    std::shared_ptr<nn::Gpt> c = nn::Gpt::Create(ReadHfGpt2Config(out).value()).value();
    ASSERT_TRUE(LoadHfGpt2(out, *c).ok());
    ExpectSameParameters(*a, *c);
  }
  // Llama, likewise.
  {
    const nn::LlamaConfig config = ReadHfLlamaConfig(kLlama).value();
    std::shared_ptr<nn::Llama> a = nn::Llama::Create(config).value();
    std::shared_ptr<nn::Llama> b = nn::Llama::Create(config).value();
    ASSERT_TRUE(LoadHfLlama(kLlama, *a).ok());
    const absl::Status loaded = LoadHfModel(kLlama, *b, /*registry=*/nullptr);
    ASSERT_TRUE(loaded.ok()) << loaded;
    ExpectSameParameters(*a, *b);
    const std::string out = ::testing::TempDir() + "/llama_export";
    ASSERT_TRUE(ExportHfModel(*b, out).ok());
    EXPECT_EQ(ReadHfModelType(out).value(), HfModelType::kLlama);
    std::shared_ptr<nn::Llama> c = nn::Llama::Create(ReadHfLlamaConfig(out).value()).value();
    ASSERT_TRUE(LoadHfLlama(out, *c).ok());
    ExpectSameParameters(*a, *c);
  }
}

TEST(HfModelTest, RefusesAModelOfNeitherFamilyOrOfTheOtherOne) {
  nn::Linear linear(4, 4);
  absl::Status s = LoadHfModel(kGpt2, linear, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("neither an nn::Gpt nor an nn::Llama"));
  s = ExportHfModel(linear, ::testing::TempDir() + "/linear");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("neither an nn::Gpt nor an nn::Llama"));

  std::shared_ptr<nn::Gpt> gpt = nn::Gpt::Create(ReadHfGpt2Config(kGpt2).value()).value();
  s = LoadHfModel(kLlama, *gpt, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("model_type is llama but the model is an nn::Gpt (gpt2)"));
}

}  // namespace
}  // namespace checkpoint
