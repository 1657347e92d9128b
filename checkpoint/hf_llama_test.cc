// Hugging Face Llama interop against data transformers made (checkpoint/testdata/hf_llama,
// written by tools/hf/llama_testdata.py): our logits on its checkpoint are transformers'
// within 1e-5, import then export gives back the same file, loading into the shards of a
// wrapped model at 1, 2 and 3 ranks gives the same logits without any rank holding the
// full model, and a missing, extra or misshapen tensor or an unsupported config field is
// an error naming it.
#include "checkpoint/hf_llama.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors.h"
#include "comm/testing/thread_ranks.h"
#include "core/param_init.h"
#include "core/status_macros.h"
#include "fsdp/fully_shard.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/wrap_policy.h"

namespace checkpoint {
namespace {

using ::testing::HasSubstr;

const char kData[] = "checkpoint/testdata/hf_llama";

std::shared_ptr<nn::Llama> Loaded(const std::string& dir = kData) {
  absl::StatusOr<nn::LlamaConfig> config = ReadHfLlamaConfig(dir);
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return nullptr;
  absl::StatusOr<std::shared_ptr<nn::Llama>> llama = nn::Llama::Create(*config);
  EXPECT_TRUE(llama.ok()) << llama.status();
  absl::Status loaded = LoadHfLlama(dir, **llama);
  EXPECT_TRUE(loaded.ok()) << loaded;
  return loaded.ok() ? *llama : nullptr;
}

SafetensorsFile Expected() {
  absl::StatusOr<SafetensorsFile> expected =
      ImportSafetensors(absl::StrCat(kData, "/expected.safetensors"));
  EXPECT_TRUE(expected.ok()) << expected.status();
  return expected.ok() ? *std::move(expected) : SafetensorsFile();
}

double MaxDifference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, std::abs(double{a[i]} - b[i]));
  }
  return worst;
}

std::string Bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(HfLlamaTest, ReadsTheConfig) {
  absl::StatusOr<nn::LlamaConfig> config = ReadHfLlamaConfig(kData);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->vocab_size, 96);
  EXPECT_EQ(config->hidden_size, 32);
  EXPECT_EQ(config->intermediate_size, 64);
  EXPECT_EQ(config->num_hidden_layers, 2);
  EXPECT_EQ(config->num_attention_heads, 4);
  EXPECT_EQ(config->num_key_value_heads, 2);
  EXPECT_EQ(config->max_position_embeddings, 32);
  EXPECT_EQ(config->rms_norm_eps, 1e-5f);
  EXPECT_EQ(config->rope_theta, 500000.0);  // from rope_parameters, as transformers 5 writes it
  EXPECT_FALSE(config->tie_word_embeddings);
}

// transformers 4 wrote rope_theta at the top level and rope_scaling null, and older
// configs have no num_key_value_heads (multi-head attention).
TEST(HfLlamaTest, ReadsTransformers4Configs) {
  const std::string dir = ::testing::TempDir() + "/llama_v4_config";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"model_type": "llama", "hidden_size": 48,
      "num_attention_heads": 6, "num_key_value_heads": null, "rope_theta": 250000.0,
      "rope_scaling": null, "rms_norm_eps": 1e-05, "tie_word_embeddings": true,
      "pretraining_tp": 1, "hidden_act": "silu"})";
  absl::StatusOr<nn::LlamaConfig> config = ReadHfLlamaConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_key_value_heads, 6);
  EXPECT_EQ(config->rope_theta, 250000.0);
  EXPECT_EQ(config->vocab_size, 32000);  // LlamaConfig's default
  EXPECT_TRUE(config->tie_word_embeddings);
}

TEST(HfLlamaTest, OurLogitsAreTransformersWithin1e5) {
  std::shared_ptr<nn::Llama> llama = Loaded();
  ASSERT_NE(llama, nullptr);
  const SafetensorsFile expected = Expected();
  const core::Tensor* ids = expected.Find("input_ids");
  const core::Tensor* want = expected.Find("logits");
  ASSERT_TRUE(ids != nullptr && want != nullptr);
  absl::StatusOr<core::Tensor> logits = llama->Forward(*ids);
  ASSERT_TRUE(logits.ok()) << logits.status();
  ASSERT_EQ(logits->shape(), want->shape());
  const std::vector<float> ref = want->ToVector();
  const double worst = MaxDifference(logits->ToVector(), ref);
  std::printf("max |our logits - transformers'| = %.3g over %zu logits\n", worst, ref.size());
  EXPECT_LE(worst, 1e-5);
  EXPECT_GT(std::abs(ref[0]), 0.1f);  // a real reference, not zeros
}

TEST(HfLlamaTest, ImportThenExportGivesBackTheSameTensorsNamesDtypesAndLayout) {
  std::shared_ptr<nn::Llama> llama = Loaded();
  ASSERT_NE(llama, nullptr);
  const std::string out = ::testing::TempDir() + "/hf_llama_export";
  absl::Status exported_ok = ExportHfLlama(*llama, out);
  ASSERT_TRUE(exported_ok.ok()) << exported_ok;
  absl::StatusOr<SafetensorsFile> original =
      ImportSafetensors(absl::StrCat(kData, "/model.safetensors"));
  absl::StatusOr<SafetensorsFile> exported = ImportSafetensors(out + "/model.safetensors");
  ASSERT_TRUE(original.ok() && exported.ok());
  ASSERT_EQ(exported->tensors.size(), original->tensors.size());
  for (size_t i = 0; i < original->tensors.size(); ++i) {
    const auto& [name, tensor] = original->tensors[i];
    const auto& [my_name, mine] = exported->tensors[i];
    EXPECT_EQ(my_name, name) << "tensor " << i;  // same names in the same order
    EXPECT_EQ(mine.dtype(), tensor.dtype()) << name;
    EXPECT_EQ(mine.shape(), tensor.shape()) << name;
    EXPECT_EQ(mine.ToVector(), tensor.ToVector()) << name;
  }
  EXPECT_EQ(exported->metadata, original->metadata);
  // Hence the same bytes as safetensors' save_file wrote: header, offsets and all.
  EXPECT_EQ(Bytes(out + "/model.safetensors"), Bytes(absl::StrCat(kData, "/model.safetensors")));
  absl::StatusOr<nn::LlamaConfig> again = ReadHfLlamaConfig(out);
  ASSERT_TRUE(again.ok()) << again.status();
  const nn::LlamaConfig& c = llama->config();
  EXPECT_EQ(again->vocab_size, c.vocab_size);
  EXPECT_EQ(again->hidden_size, c.hidden_size);
  EXPECT_EQ(again->intermediate_size, c.intermediate_size);
  EXPECT_EQ(again->num_hidden_layers, c.num_hidden_layers);
  EXPECT_EQ(again->num_attention_heads, c.num_attention_heads);
  EXPECT_EQ(again->num_key_value_heads, c.num_key_value_heads);
  EXPECT_EQ(again->max_position_embeddings, c.max_position_embeddings);
  EXPECT_EQ(again->rms_norm_eps, c.rms_norm_eps);
  EXPECT_EQ(again->rope_theta, c.rope_theta);
  EXPECT_EQ(again->tie_word_embeddings, c.tie_word_embeddings);
  EXPECT_THAT(Bytes(out + "/config.json"), HasSubstr("\"rms_norm_eps\": 1e-05"));
}

// A copy of the test checkpoint with `edit` applied to its tensors.
// IEEE half precision, rounded to nearest even, for finite |f| < 65520 (the test's values).
uint16_t ToHalf(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const float a = std::fabs(f);
  if (a < std::ldexp(1.0f, -14)) {  // subnormal: a multiple of 2^-24 (1024 is the least normal)
    return static_cast<uint16_t>(sign | static_cast<int>(std::nearbyint(std::ldexp(a, 24))));
  }
  int e;
  const float mantissa = std::frexp(a, &e);  // a = mantissa 2^e, mantissa in [0.5, 1)
  int q = static_cast<int>(std::nearbyint(std::ldexp(mantissa, 11)));  // in [1024, 2048]
  int biased = e - 1 + 15;
  if (q == 2048) {
    q = 1024;
    ++biased;
  }
  return static_cast<uint16_t>(sign | (biased << 10) | (q - 1024));
}

// The value of a finite half.
float FromHalf(uint16_t h) {
  const int biased = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double v = biased == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, biased - 25);
  return static_cast<float>((h & 0x8000) ? -v : v);
}

std::string Edited(const std::string& name, const std::function<void(NamedTensors*)>& edit) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(absl::StrCat(kData, "/config.json"), dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  absl::StatusOr<SafetensorsFile> file =
      ImportSafetensors(absl::StrCat(kData, "/model.safetensors"));
  EXPECT_TRUE(file.ok());
  NamedTensors tensors = file->tensors;
  edit(&tensors);
  EXPECT_TRUE(ExportSafetensors(dir + "/model.safetensors", tensors).ok());
  return dir;
}

void Erase(NamedTensors* t, const std::string& name) {
  t->erase(std::remove_if(t->begin(), t->end(), [&](const auto& e) { return e.first == name; }),
           t->end());
}

TEST(HfLlamaTest, AMissingExtraOrMisshapenTensorIsAnErrorNamingIt) {
  absl::StatusOr<std::shared_ptr<nn::Llama>> llama = nn::Llama::Create(*ReadHfLlamaConfig(kData));
  ASSERT_TRUE(llama.ok());
  const std::vector<float> before = (*llama)->NamedParameters()[0].second->data.ToVector();

  const std::string missing =
      Edited("missing", [](NamedTensors* t) { Erase(t, "model.layers.1.mlp.up_proj.weight"); });
  absl::Status s = LoadHfLlama(missing, **llama);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'layers.1.mlp.up_proj.weight' (for "
                                     "'layers.1.mlp.up_proj.weight') is in none"));

  // Untied: lm_head is a parameter of its own, and must be there.
  const std::string no_head =
      Edited("no_head", [](NamedTensors* t) { Erase(t, "lm_head.weight"); });
  s = LoadHfLlama(no_head, **llama);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'lm_head.weight'"));

  const std::string extra = Edited("extra", [](NamedTensors* t) {
    t->emplace_back("model.layers.0.self_attn.q_norm.weight", core::Tensor::Zeros({8}));
  });
  s = LoadHfLlama(extra, **llama);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'layers.0.self_attn.q_norm.weight'"));
  EXPECT_THAT(s.message(), HasSubstr("belongs to no parameter of this Llama"));

  const std::string misshapen = Edited("misshapen", [](NamedTensors* t) {
    for (auto& [name, tensor] : *t) {
      // As if k_proj had 4 kv heads, not 2.
      if (name == "model.layers.0.self_attn.k_proj.weight") tensor = core::Tensor::Zeros({32, 32});
    }
  });
  s = LoadHfLlama(misshapen, **llama);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'layers.0.self_attn.k_proj.weight'"));
  EXPECT_THAT(s.message(),
              HasSubstr("is [32, 32]; 'layers.0.self_attn.k_proj.weight' needs [16, 32]"));

  // Nothing changed on error.
  EXPECT_EQ((*llama)->NamedParameters()[0].second->data.ToVector(), before);

  // The rotary inverse frequencies older transformers saved are buffers: skipped.
  const std::string buffers = Edited("buffers", [](NamedTensors* t) {
    t->emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", core::Tensor::Zeros({4}));
  });
  EXPECT_TRUE(LoadHfLlama(buffers, **llama).ok());
}

TEST(HfLlamaTest, AConfigThisLlamaDoesNotComputeIsRefusedNamingTheField) {
  const std::string dir = ::testing::TempDir() + "/bad_llama_config";
  std::filesystem::create_directories(dir);
  const std::string base = R"("model_type": "llama", "hidden_size": 32, "num_attention_heads": 4)";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("hidden_act": "gelu")", "hidden_act"},
      {R"("attention_bias": true)", "attention_bias"},
      {R"("mlp_bias": true)", "mlp_bias"},
      {R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})", "rope_scaling"},
      {R"("rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4})",
       "rope_parameters.rope_type"},
      {R"("rope_parameters": {"rope_type": "default", "factor": 2.0})", "rope_parameters.factor"},
      {R"("partial_rotary_factor": 0.5)", "partial_rotary_factor"},
      {R"("head_dim": 16)", "head_dim"},
      {R"("num_key_value_heads": 3)", "num_key_value_heads"},
      {R"("tie_word_embeddings": "yes")", "tie_word_embeddings"},
      {R"("vocab_size": 0)", "vocab_size"},
  };
  for (const auto& [field_json, field] : cases) {
    std::ofstream(dir + "/config.json") << "{" << base << ", " << field_json << "}";
    absl::StatusOr<nn::LlamaConfig> config = ReadHfLlamaConfig(dir);
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << field_json;
    EXPECT_THAT(config.status().message(), HasSubstr(field)) << field_json;
    EXPECT_THAT(config.status().message(), HasSubstr(dir + "/config.json")) << field_json;
  }
  std::ofstream(dir + "/config.json") << R"({"model_type": "mistral"})";
  EXPECT_THAT(ReadHfLlamaConfig(dir).status().message(), HasSubstr("model_type"));
  // What transformers writes for the default rotary embedding is fine.
  std::ofstream(dir + "/config.json")
      << "{" << base
      << R"(, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}, "head_dim": 8,
            "rope_scaling": null, "hidden_act": "swish"})";
  EXPECT_TRUE(ReadHfLlamaConfig(dir).ok()) << ReadHfLlamaConfig(dir).status();
}

// The same checkpoint split over two files with transformers' index, in bf16 and in f16: the
// index gives the same parameters bit for bit, bf16 and f16 the values rounded to them.
TEST(HfLlamaTest, ReadsShardedIndexesBf16AndF16) {
  std::shared_ptr<nn::Llama> reference = Loaded();
  ASSERT_NE(reference, nullptr);
  absl::StatusOr<SafetensorsFile> file =
      ImportSafetensors(absl::StrCat(kData, "/model.safetensors"));
  ASSERT_TRUE(file.ok());

  const std::string sharded = ::testing::TempDir() + "/hf_llama_sharded";
  std::filesystem::create_directories(sharded);
  std::filesystem::copy_file(absl::StrCat(kData, "/config.json"), sharded + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  NamedTensors first, second;
  std::string weight_map;
  for (size_t i = 0; i < file->tensors.size(); ++i) {
    const bool one = i < file->tensors.size() / 2;
    (one ? first : second).push_back(file->tensors[i]);
    absl::StrAppend(&weight_map, weight_map.empty() ? "" : ", ", "\"", file->tensors[i].first,
                    "\": \"model-0000", one ? 1 : 2, "-of-00002.safetensors\"");
  }
  ASSERT_TRUE(ExportSafetensors(sharded + "/model-00001-of-00002.safetensors", first).ok());
  ASSERT_TRUE(ExportSafetensors(sharded + "/model-00002-of-00002.safetensors", second).ok());
  std::ofstream(sharded + "/model.safetensors.index.json")
      << R"({"metadata": {"total_size": 98304}, "weight_map": {)" << weight_map << "}}";
  std::shared_ptr<nn::Llama> from_index = Loaded(sharded);
  ASSERT_NE(from_index, nullptr);
  const auto want = reference->NamedParameters();
  const auto got = from_index->NamedParameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].second->data.ToVector(), want[i].second->data.ToVector()) << got[i].first;
  }

  const std::string bf16 = Edited("bf16", [](NamedTensors* t) {
    for (auto& [name, tensor] : *t) {
      tensor = *tensor.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther);
    }
  });
  std::shared_ptr<nn::Llama> from_bf16 = Loaded(bf16);
  ASSERT_NE(from_bf16, nullptr);
  const auto rounded = from_bf16->NamedParameters();
  for (size_t i = 0; i < rounded.size(); ++i) {
    absl::StatusOr<core::Tensor> r =
        want[i].second->data.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(rounded[i].second->data.dtype(), core::DType::kFloat32);
    EXPECT_EQ(rounded[i].second->data.ToVector(), r->ToVector()) << rounded[i].first;
  }

  // The whole checkpoint in F16, written by hand (the library exports F32 and BF16 only): it
  // loads, each parameter the half-precision rounding of the reference's, widened.
  const std::string f16 = ::testing::TempDir() + "/hf_llama_f16";
  std::filesystem::create_directories(f16);
  std::filesystem::copy_file(absl::StrCat(kData, "/config.json"), f16 + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  absl::StatusOr<SafetensorsFile> source =
      ImportSafetensors(absl::StrCat(kData, "/model.safetensors"));
  ASSERT_TRUE(source.ok()) << source.status();
  std::string header = "{", buffer;
  for (const auto& [name, tensor] : source->tensors) {
    std::string shape;
    for (int64_t d : tensor.shape()) absl::StrAppend(&shape, shape.empty() ? "" : ",", d);
    absl::StrAppend(&header, header.size() > 1 ? "," : "", "\"", name,
                    "\":{\"dtype\":\"F16\",\"shape\":[", shape, "],\"data_offsets\":[",
                    buffer.size(), ",", buffer.size() + 2 * tensor.numel(), "]}");
    for (float v : tensor.ToVector()) {
      const uint16_t h = ToHalf(v);
      buffer.push_back(static_cast<char>(h & 0xff));
      buffer.push_back(static_cast<char>(h >> 8));
    }
  }
  header += "}";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  std::string length(8, '\0');
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  std::ofstream(f16 + "/model.safetensors", std::ios::binary) << length << header << buffer;
  std::shared_ptr<nn::Llama> from_f16 = Loaded(f16);
  ASSERT_NE(from_f16, nullptr);
  const auto halves = from_f16->NamedParameters();
  ASSERT_EQ(halves.size(), want.size());
  for (size_t i = 0; i < halves.size(); ++i) {
    EXPECT_EQ(halves[i].second->data.dtype(), core::DType::kFloat32);
    const std::vector<float> w = want[i].second->data.ToVector();
    const std::vector<float> h = halves[i].second->data.ToVector();
    ASSERT_EQ(h.size(), w.size());
    for (size_t j = 0; j < w.size(); ++j) {
      ASSERT_EQ(h[j], FromHalf(ToHalf(w[j]))) << halves[i].first << " element " << j;
    }
  }
}

// Tied embeddings: the export has no lm_head.weight (as transformers saves a tied model)
// and loads back; a stored lm_head must be the embedding.
TEST(HfLlamaTest, TiedModelsExportWithoutLmHeadAndCheckAStoredOne) {
  nn::LlamaConfig config = *ReadHfLlamaConfig(kData);
  config.tie_word_embeddings = true;
  config.seed = 7;
  absl::StatusOr<std::shared_ptr<nn::Llama>> tied = nn::Llama::Create(config);
  ASSERT_TRUE(tied.ok());
  const std::string out = ::testing::TempDir() + "/hf_llama_tied";
  ASSERT_TRUE(ExportHfLlama(**tied, out).ok());
  absl::StatusOr<SafetensorsFile> exported = ImportSafetensors(out + "/model.safetensors");
  ASSERT_TRUE(exported.ok());
  EXPECT_EQ(exported->Find("lm_head.weight"), nullptr);
  EXPECT_NE(exported->Find("model.embed_tokens.weight"), nullptr);
  std::shared_ptr<nn::Llama> back = Loaded(out);
  ASSERT_NE(back, nullptr);
  EXPECT_TRUE(back->config().tie_word_embeddings);
  const auto want = (*tied)->NamedParameters();
  const auto got = back->NamedParameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].second->data.ToVector(), want[i].second->data.ToVector()) << got[i].first;
  }

  NamedTensors tensors = exported->tensors;
  tensors.emplace_back("lm_head.weight", *exported->Find("model.embed_tokens.weight"));
  ASSERT_TRUE(ExportSafetensors(out + "/model.safetensors", tensors).ok());
  EXPECT_TRUE(LoadHfLlama(out, *back).ok());  // equal to the embedding: fine
  tensors.back().second = core::Tensor::Zeros(tensors.back().second.shape());
  ASSERT_TRUE(ExportSafetensors(out + "/model.safetensors", tensors).ok());
  absl::Status s = LoadHfLlama(out, *back);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("lm_head.weight in "));
  EXPECT_THAT(s.message(), HasSubstr("differs from embed_tokens.weight; this Llama ties them"));
}

// Straight into FSDP shards: each of N ranks wraps a deferred Llama (no parameter memory)
// and loads only its parts, one tensor at a time; the wrapped model computes
// transformers' logits, and no rank ever held more than its shards, their staging and two
// tensors' worth (the full model, once N > 2).
class HfLlamaShardedTest : public ::testing::TestWithParam<int> {};

TEST_P(HfLlamaShardedTest, LoadsIntoTheShardsOfADeferredWrappedModel) {
  const int world = GetParam();
  absl::StatusOr<nn::LlamaConfig> config = ReadHfLlamaConfig(kData);
  ASSERT_TRUE(config.ok());
  const SafetensorsFile expected = Expected();
  const std::vector<float> want = expected.Find("logits")->ToVector();
  int64_t full_bytes = 0;
  {
    absl::StatusOr<std::shared_ptr<nn::Llama>> probe = nn::Llama::Create(*config);
    ASSERT_TRUE(probe.ok());
    full_bytes = 4 * (*probe)->NumParameterElements();
  }
  // embed_tokens and lm_head, [V, C]: read as stored, then (bf16 sources) converted.
  const int64_t largest_tensor_bytes = 4 * config->vocab_size * config->hidden_size;
  // The part of the bound that is not the shards is far below the model.
  ASSERT_LT(2 * largest_tensor_bytes + 1024, full_bytes / 3);
  std::vector<int64_t> peaks(world), bounds(world);
  std::vector<double> worst(world);
  absl::Status s =
      comm::testing::RunThreadRanks(world, [&](comm::testing::RankContext& ctx) -> absl::Status {
        std::shared_ptr<nn::Llama> llama;
        {
          core::DeferredInitScope deferred;
          ASSIGN_OR_RETURN(llama, nn::Llama::Create(*config));
        }
        ctx.allocator->ResetPeaks();
        const int64_t before = ctx.allocator->Stats().current_total;
        fsdp::WrapperRegistry registry;
        fsdp::FullyShardOptions options;
        options.policy = policy::ModuleTypes({"LlamaDecoderLayer"});
        ASSIGN_OR_RETURN(auto handle, fsdp::FullyShard(llama, ctx.group, options, &registry));
        RETURN_IF_ERROR(LoadHfLlama(kData, *llama, &registry));
        peaks[ctx.rank] = ctx.allocator->Stats().peak_total - before;
        int64_t shard_bytes = 0;
        for (const auto& unit : handle->units()) shard_bytes += 4 * unit->flat().shard_numel();
        bounds[ctx.rank] = 2 * shard_bytes + 2 * largest_tensor_bytes + 1024;
        ASSIGN_OR_RETURN(core::Tensor logits, llama->Forward(*expected.Find("input_ids")));
        worst[ctx.rank] = MaxDifference(logits.ToVector(), want);
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < world; ++r) {
    EXPECT_LE(worst[r], 1e-5) << "rank " << r;
    // Its shards and its parts' staging (one shard's size each), and one tensor at a time
    // as read and converted: never the model beside its shards.
    EXPECT_LE(peaks[r], bounds[r]) << "rank " << r;
    if (world > 2) {
      EXPECT_LT(peaks[r], full_bytes) << "rank " << r;
    }
    std::printf(
        "%d ranks, rank %d: max |logits - transformers'| %.3g; loading peak %lld B "
        "(bound: 2 x shards + 2 x the largest tensor = %lld B), full model %lld B\n",
        world, r, worst[r], static_cast<long long>(peaks[r]), static_cast<long long>(bounds[r]),
        static_cast<long long>(full_bytes));
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, HfLlamaShardedTest, ::testing::Values(1, 2, 3));

}  // namespace
}  // namespace checkpoint
