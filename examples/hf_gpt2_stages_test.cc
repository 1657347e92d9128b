// The Hugging Face stage example on the committed transformers checkpoint
// (checkpoint/testdata/hf_gpt2) and a token file, at 2 ranks: it loads, trains (the loss
// falls, the test loss improves), releases and exports a directory that loads back with
// the trained values.
#include "examples/hf_gpt2_stages.h"

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/hf_gpt2.h"
#include "comm/testing/thread_ranks.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"

namespace examples {
namespace {

// A nanoGPT-layout token file (bare uint16) of a repeating pattern over 64 tokens.
std::string TokenFile(const std::string& name) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::vector<uint16_t> tokens(20000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 5 + i / 7) % 64);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t));
  return path;
}

TEST(HfGpt2StagesTest, FitsFromTheCheckpointTestsReleasesAndExports) {
  HfGpt2StagesOptions o;
  o.hf_dir = "checkpoint/testdata/hf_gpt2";
  o.data = TokenFile("tokens.bin");
  o.out_dir = ::testing::TempDir() + "/tuned";
  o.steps = 30;
  o.lr = 3e-3;
  std::vector<HfGpt2StagesResult> results(2);
  absl::Status s = comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx)
                                                        -> absl::Status {
    ASSIGN_OR_RETURN(results[ctx.rank], RunHfGpt2Stages(ctx.group, o));
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  const HfGpt2StagesResult& r = results[0];
  std::printf("test loss %.4f as loaded; fit %.4f -> %.4f; test loss %.4f after\n",
              r.test_loss_before, r.first_train_loss, r.final_train_loss, r.test_loss_after);
  EXPECT_LT(r.final_train_loss, r.first_train_loss - 0.5);
  EXPECT_LT(r.test_loss_after, r.test_loss_before - 0.5);
  EXPECT_EQ(results[1].test_loss_after, r.test_loss_after);  // every rank agrees
  // The export loads back: a GPT-2 of the same config with the trained weights.
  absl::StatusOr<nn::GptConfig> config = checkpoint::ReadHfGpt2Config(o.out_dir);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::shared_ptr<nn::Gpt>> gpt = nn::Gpt::Create(*config);
  ASSERT_TRUE(gpt.ok());
  EXPECT_TRUE(checkpoint::LoadHfGpt2(o.out_dir, **gpt).ok());
}

}  // namespace
}  // namespace examples
