// The Hugging Face stage example on the committed transformers checkpoints
// (checkpoint/testdata/hf_gpt2, checkpoint/testdata/hf_llama) and a token file, at 2 ranks:
// it loads, trains (the loss falls, the test loss improves), releases and exports a
// directory that loads back; another model_type is refused naming it.
#include "examples/hf_stages.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "checkpoint/hf_gpt2.h"
#include "checkpoint/hf_llama.h"
#include "comm/testing/thread_ranks.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"

namespace examples {
namespace {

// A nanoGPT-layout token file (bare uint16) of a repeating pattern over 64 tokens.
std::string TokenFile(const std::string& name) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::vector<uint16_t> tokens(20000);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<uint16_t>((i * 5 + i / 7) % 64);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t));
  return path;
}

// Runs the example on `hf_dir` at 2 ranks, checks that it learned, and returns rank 0's
// result.
HfStagesResult RunAndCheck(const std::string& hf_dir, const std::string& out_dir) {
  HfStagesOptions o;
  o.hf_dir = hf_dir;
  o.data = TokenFile("tokens.bin");
  o.out_dir = out_dir;
  o.steps = 30;
  o.lr = 3e-3;
  std::vector<HfStagesResult> results(2);
  absl::Status s =
      comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(results[ctx.rank], RunHfStages(ctx.group, o));
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
  const HfStagesResult& r = results[0];
  std::printf("%s: test loss %.4f as loaded; fit %.4f -> %.4f; test loss %.4f after\n",
              r.model_type.c_str(), r.test_loss_before, r.first_train_loss, r.final_train_loss,
              r.test_loss_after);
  EXPECT_LT(r.final_train_loss, r.first_train_loss - 0.5);
  EXPECT_LT(r.test_loss_after, r.test_loss_before - 0.5);
  EXPECT_EQ(results[1].test_loss_after, r.test_loss_after);  // every rank agrees
  return r;
}

TEST(HfStagesTest, Gpt2FitsFromTheCheckpointTestsReleasesAndExports) {
  const std::string out = ::testing::TempDir() + "/tuned_gpt2";
  EXPECT_EQ(RunAndCheck("checkpoint/testdata/hf_gpt2", out).model_type, "gpt2");
  // The export loads back: a GPT-2 of the same config with the trained weights.
  absl::StatusOr<nn::GptConfig> config = checkpoint::ReadHfGpt2Config(out);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::shared_ptr<nn::Gpt>> gpt = nn::Gpt::Create(*config);
  ASSERT_TRUE(gpt.ok());
  EXPECT_TRUE(checkpoint::LoadHfGpt2(out, **gpt).ok());
}

TEST(HfStagesTest, LlamaFitsFromTheCheckpointTestsReleasesAndExports) {
  const std::string out = ::testing::TempDir() + "/tuned_llama";
  EXPECT_EQ(RunAndCheck("checkpoint/testdata/hf_llama", out).model_type, "llama");
  absl::StatusOr<nn::LlamaConfig> config = checkpoint::ReadHfLlamaConfig(out);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::shared_ptr<nn::Llama>> llama = nn::Llama::Create(*config);
  ASSERT_TRUE(llama.ok());
  EXPECT_TRUE(checkpoint::LoadHfLlama(out, **llama).ok());
}

TEST(HfStagesTest, AnotherModelTypeIsRefusedNamingIt) {
  const std::string dir = ::testing::TempDir() + "/bert";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"model_type": "bert"})";
  HfStagesOptions o;
  o.hf_dir = dir;
  absl::Status s = comm::testing::RunThreadRanks(
      1, [&](comm::testing::RankContext& ctx) { return RunHfStages(ctx.group, o).status(); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "model_type \"bert\"")) << s;
}

}  // namespace
}  // namespace examples
