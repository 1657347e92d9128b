// Hugging Face GPT-2 interop against data transformers made (checkpoint/testdata/hf_gpt2,
// written by tools/hf/gpt2_testdata.py): our logits on its checkpoint are transformers'
// within 1e-5, import then export gives back the same tensors, names and layout, and a
// missing, extra or misshapen tensor is an error naming it.
#include "checkpoint/hf_gpt2.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

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

const char kData[] = "checkpoint/testdata/hf_gpt2";

std::shared_ptr<nn::Gpt> Loaded() {
  absl::StatusOr<nn::GptConfig> config = ReadHfGpt2Config(kData);
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return nullptr;
  absl::StatusOr<std::shared_ptr<nn::Gpt>> gpt = nn::Gpt::Create(*config);
  EXPECT_TRUE(gpt.ok()) << gpt.status();
  absl::Status loaded = LoadHfGpt2(kData, **gpt);
  EXPECT_TRUE(loaded.ok()) << loaded;
  return loaded.ok() ? *gpt : nullptr;
}

TEST(HfGpt2Test, ReadsTheConfig) {
  absl::StatusOr<nn::GptConfig> config = ReadHfGpt2Config(kData);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->vocab_size, 64);
  EXPECT_EQ(config->block_size, 32);
  EXPECT_EQ(config->n_embd, 32);
  EXPECT_EQ(config->n_layer, 2);
  EXPECT_EQ(config->n_head, 4);
}

TEST(HfGpt2Test, OurLogitsAreTransformersWithin1e5) {
  std::shared_ptr<nn::Gpt> gpt = Loaded();
  ASSERT_NE(gpt, nullptr);
  absl::StatusOr<SafetensorsFile> expected =
      ImportSafetensors(absl::StrCat(kData, "/expected.safetensors"));
  ASSERT_TRUE(expected.ok()) << expected.status();
  const core::Tensor* ids = expected->Find("input_ids");
  const core::Tensor* want = expected->Find("logits");
  ASSERT_TRUE(ids != nullptr && want != nullptr);
  absl::StatusOr<core::Tensor> logits = gpt->Forward(*ids);
  ASSERT_TRUE(logits.ok()) << logits.status();
  ASSERT_EQ(logits->shape(), want->shape());
  const std::vector<float> got = logits->ToVector(), ref = want->ToVector();
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(double{got[i]} - ref[i]));
  std::printf("max |our logits - transformers'| = %.3g over %zu logits\n", worst, got.size());
  EXPECT_LE(worst, 1e-5);
  EXPECT_GT(std::abs(ref[0]), 0.0f);  // a real reference, not zeros
}

TEST(HfGpt2Test, ImportThenExportGivesBackTheSameTensorsNamesAndLayout) {
  std::shared_ptr<nn::Gpt> gpt = Loaded();
  ASSERT_NE(gpt, nullptr);
  const std::string out = ::testing::TempDir() + "/hf_gpt2_export";
  ASSERT_TRUE(ExportHfGpt2(*gpt, out).ok());
  absl::StatusOr<SafetensorsFile> original =
      ImportSafetensors(absl::StrCat(kData, "/model.safetensors"));
  absl::StatusOr<SafetensorsFile> exported = ImportSafetensors(out + "/model.safetensors");
  ASSERT_TRUE(original.ok() && exported.ok());
  ASSERT_EQ(exported->tensors.size(), original->tensors.size());
  for (const auto& [name, tensor] : original->tensors) {
    const core::Tensor* mine = exported->Find(name);
    ASSERT_NE(mine, nullptr) << name;
    EXPECT_EQ(mine->shape(), tensor.shape()) << name;
    EXPECT_EQ(mine->ToVector(), tensor.ToVector()) << name;
  }
  absl::StatusOr<nn::GptConfig> again = ReadHfGpt2Config(out);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->n_layer, 2);
  EXPECT_EQ(again->vocab_size, 64);
}

// A copy of the test checkpoint with `edit` applied to its tensors.
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

TEST(HfGpt2Test, AMissingExtraOrMisshapenTensorIsAnErrorNamingIt) {
  absl::StatusOr<std::shared_ptr<nn::Gpt>> gpt = nn::Gpt::Create(*ReadHfGpt2Config(kData));
  ASSERT_TRUE(gpt.ok());
  const std::vector<float> before = (*gpt)->NamedParameters()[0].second->data.ToVector();

  const std::string missing = Edited("missing", [](NamedTensors* t) {
    t->erase(
        std::remove_if(t->begin(), t->end(),
                       [](const auto& e) { return e.first == "transformer.h.1.mlp.c_fc.bias"; }),
        t->end());
  });
  absl::Status s = LoadHfGpt2(missing, **gpt);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'h.1.mlp.c_fc.bias' (for 'blocks.1.mlp.fc.bias')"));

  const std::string extra = Edited("extra", [](NamedTensors* t) {
    t->emplace_back("transformer.h.0.attn.q_norm.weight", core::Tensor::Zeros({32}));
  });
  s = LoadHfGpt2(extra, **gpt);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'h.0.attn.q_norm.weight'"));
  EXPECT_THAT(s.message(), HasSubstr("belongs to no parameter"));

  const std::string misshapen = Edited("misshapen", [](NamedTensors* t) {
    for (auto& [name, tensor] : *t) {
      if (name == "transformer.h.0.attn.c_attn.weight") tensor = core::Tensor::Zeros({96, 32});
    }
  });
  s = LoadHfGpt2(misshapen, **gpt);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'h.0.attn.c_attn.weight'"));
  EXPECT_THAT(s.message(), HasSubstr("needs [32, 96] (Conv1D layout [in, out])"));

  // Nothing changed on error.
  EXPECT_EQ((*gpt)->NamedParameters()[0].second->data.ToVector(), before);
}

// Straight into FSDP shards: each of 3 ranks wraps a deferred Gpt (no parameter memory)
// and loads only its parts, one tensor at a time; the wrapped model computes
// transformers' logits, and no rank ever held the full model.
TEST(HfGpt2Test, LoadsIntoTheShardsOfADeferredWrappedModel) {
  absl::StatusOr<nn::GptConfig> config = ReadHfGpt2Config(kData);
  ASSERT_TRUE(config.ok());
  absl::StatusOr<SafetensorsFile> expected =
      ImportSafetensors(absl::StrCat(kData, "/expected.safetensors"));
  ASSERT_TRUE(expected.ok());
  const std::vector<float> want = expected->Find("logits")->ToVector();
  int64_t full_bytes = 0;
  {
    absl::StatusOr<std::shared_ptr<nn::Gpt>> probe = nn::Gpt::Create(*config);
    ASSERT_TRUE(probe.ok());
    full_bytes = 4 * (*probe)->NumParameterElements();
  }
  std::vector<int64_t> peaks(3), bounds(3);
  std::vector<double> worst(3);
  // mlp.c_fc.weight, [C, 4C]: read, then transposed into our layout.
  const int64_t largest_tensor_bytes = 4 * 4 * config->n_embd * config->n_embd;
  absl::Status s =
      comm::testing::RunThreadRanks(3, [&](comm::testing::RankContext& ctx) -> absl::Status {
        std::shared_ptr<nn::Gpt> gpt;
        {
          core::DeferredInitScope deferred;
          ASSIGN_OR_RETURN(gpt, nn::Gpt::Create(*config));
        }
        ctx.allocator->ResetPeaks();
        const int64_t before = ctx.allocator->Stats().current_total;
        fsdp::WrapperRegistry registry;
        fsdp::FullyShardOptions options;
        options.policy = policy::ModuleTypes({"TransformerBlock"});
        ASSIGN_OR_RETURN(auto handle, fsdp::FullyShard(gpt, ctx.group, options, &registry));
        RETURN_IF_ERROR(LoadHfGpt2(kData, *gpt, &registry));
        peaks[ctx.rank] = ctx.allocator->Stats().peak_total - before;
        int64_t shard_bytes = 0;
        for (const auto& unit : handle->units()) shard_bytes += 4 * unit->flat().shard_numel();
        bounds[ctx.rank] = 2 * shard_bytes + 2 * largest_tensor_bytes + 1024;
        ASSIGN_OR_RETURN(core::Tensor logits, gpt->Forward(*expected->Find("input_ids")));
        const std::vector<float> got = logits.ToVector();
        for (size_t i = 0; i < got.size(); ++i) {
          worst[ctx.rank] = std::max(worst[ctx.rank], std::abs(double{got[i]} - want[i]));
        }
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 3; ++r) {
    EXPECT_LE(worst[r], 1e-5) << "rank " << r;
    // Its shards and its parts' staging (one shard's size each), and one tensor at a time
    // as read and in our layout: never the model (at scale, far below it).
    EXPECT_LE(peaks[r], bounds[r]) << "rank " << r;
    EXPECT_LT(peaks[r], full_bytes) << "rank " << r;
    std::printf(
        "rank %d: max |logits - transformers'| %.3g; loading peak %lld B (bound: 2 x "
        "shards + 2 x the largest tensor = %lld B), full model %lld B\n",
        r, worst[r], static_cast<long long>(peaks[r]), static_cast<long long>(bounds[r]),
        static_cast<long long>(full_bytes));
  }
}

TEST(HfGpt2Test, AConfigThisGptDoesNotComputeIsRefusedNamingTheField) {
  const std::string dir = ::testing::TempDir() + "/relu_config";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"model_type": "gpt2", "n_embd": 32, "n_head": 4,
      "activation_function": "relu"})";
  absl::StatusOr<nn::GptConfig> config = ReadHfGpt2Config(dir);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("activation_function"));
  std::ofstream(dir + "/config.json") << R"({"model_type": "llama"})";
  EXPECT_THAT(ReadHfGpt2Config(dir).status().message(), HasSubstr("model_type"));
}

}  // namespace
}  // namespace checkpoint
