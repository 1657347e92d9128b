// GptTrainModule with a GPT-2-sized vocabulary: NOTE [Language vocabulary] caps the
// Markov language's vocabulary so its dense transition table stays small, and the
// module is created quickly; bad options are refused naming the option. (That the
// module learns is gpt_learning_test.)
#include "integration/gpt_module.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace integration {
namespace {

using ::testing::HasSubstr;

TEST(LanguageVocabTest, KeepsVocabulariesTheTableAllowsAndCapsTheRest) {
  EXPECT_EQ(LanguageVocabFor(64, 1), 64);
  EXPECT_EQ(LanguageVocabFor(4096, 1), 4096);  // 4096^2 = 2^24 transition probabilities
  EXPECT_EQ(LanguageVocabFor(4097, 1), kCappedLanguageVocab);
  EXPECT_EQ(LanguageVocabFor(50304, 1), kCappedLanguageVocab);
  EXPECT_EQ(LanguageVocabFor(256, 2), 256);    // 256^3 = 2^24
  EXPECT_EQ(LanguageVocabFor(300, 2), kCappedLanguageVocab);
  // 100^4 > 2^24: capped, but never above the model's own vocabulary (min(V, 128)).
  EXPECT_EQ(LanguageVocabFor(100, 3), 100);
}

TEST(GptTrainModuleTest, Gpt2VocabularyCreatesQuicklyWithTheCappedLanguage) {
  GptModuleOptions options;
  options.model.vocab_size = 50304;
  options.model.block_size = 16;
  options.model.n_embd = 8;
  options.model.n_layer = 1;
  options.model.n_head = 2;
  options.seq_len = 16;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<GptTrainModule>> module = GptTrainModule::Create(options);
  ASSERT_TRUE(module.ok()) << module.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_EQ((*module)->language().vocab_size(), kCappedLanguageVocab);
  absl::StatusOr<data::TokenBatch> batch = (*module)->language().Batch(0, 4, 16);
  ASSERT_TRUE(batch.ok()) << batch.status();
  const std::vector<float> tokens = batch->inputs.ToVector();
  EXPECT_LT(*std::max_element(tokens.begin(), tokens.end()), kCappedLanguageVocab);
  EXPECT_GT((*module)->EntropyFloor(), 0);
}

TEST(GptTrainModuleTest, BadOptionsNameTheOption) {
  GptModuleOptions options;
  options.seq_len = 64;  // longer than block_size 32
  absl::Status s = GptTrainModule::Create(options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("GptModuleOptions.seq_len"));
  options = GptModuleOptions();
  options.warmup_steps = -1;
  EXPECT_THAT(GptTrainModule::Create(options).status().message(),
              HasSubstr("GptModuleOptions.warmup_steps"));
}

}  // namespace
}  // namespace integration
