// GptTrainModule with a GPT-2-sized vocabulary: NOTE [Language vocabulary] caps the
// Markov language's vocabulary so its dense transition table stays small, and the
// module is created quickly; bad options are refused naming the option. (That the
// module learns is gpt_learning_test.)
#include "integration/gpt_module.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "data/token_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace integration {
namespace {

using ::testing::HasSubstr;

std::string TokensDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/gpt_module_tokens";
  std::filesystem::create_directories(dir);
  return dir;
}

// An llm.c uint16 token file of `text`, one token per byte; its path.
std::string WriteTokens(const std::string& dir, const std::string& name, const std::string& text) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = static_cast<int32_t>(text.size());
  std::ofstream out(dir + "/" + name, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  for (unsigned char c : text) {
    const uint16_t t = c;
    out.write(reinterpret_cast<const char*>(&t), 2);
  }
  return dir + "/" + name;
}

TEST(LanguageVocabTest, KeepsVocabulariesTheTableAllowsAndCapsTheRest) {
  EXPECT_EQ(LanguageVocabFor(64, 1), 64);
  EXPECT_EQ(LanguageVocabFor(4096, 1), 4096);  // 4096^2 = 2^24 transition probabilities
  EXPECT_EQ(LanguageVocabFor(4097, 1), kCappedLanguageVocab);
  EXPECT_EQ(LanguageVocabFor(50304, 1), kCappedLanguageVocab);
  EXPECT_EQ(LanguageVocabFor(256, 2), 256);  // 256^3 = 2^24
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

// Token files (GptModuleOptions::data_path): the module trains on them (a repeated text
// becomes predictable: the loss falls from about log 256 far below it), evaluates on the
// eval file, has no entropy floor, and a token outside the model's vocabulary fails the
// step naming the file.
TEST(GptTrainModuleTest, TrainsOnTokenFilesAndNamesOutOfVocabularyTokens) {
  const std::string dir = TokensDir();
  const auto write = [&](const std::string& name, const std::string& text) {
    return WriteTokens(dir, name, text);
  };
  std::string text;
  while (text.size() < 4000) text += "abcabd, abcabd! ";
  GptModuleOptions options;
  options.model.vocab_size = 256;
  options.model.block_size = 16;
  options.model.n_embd = 32;
  options.model.n_layer = 1;
  options.model.n_head = 2;
  options.seq_len = 16;
  options.warmup_steps = 0;
  options.data_path = write("train.bin", text);
  options.eval_data_path = write("eval.bin", text.substr(0, 500));
  absl::StatusOr<std::unique_ptr<GptTrainModule>> module = GptTrainModule::Create(options);
  ASSERT_TRUE(module.ok()) << module.status();
  GptTrainModule& m = **module;
  EXPECT_TRUE(m.uses_token_files());
  EXPECT_TRUE(std::isnan(m.EntropyFloor()));
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> opt =
      m.ConfigureOptimizer(m.model()->NamedParameters());
  ASSERT_TRUE(opt.ok()) << opt.status();
  StepContext ctx;
  ctx.batch_size = 8;
  double first = 0, last = 0;
  for (int64_t step = 0; step < 60; ++step) {
    ctx.step = step;
    (*opt)->ZeroGrad();
    absl::StatusOr<StepOutput> out = m.TrainingStep(ctx);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_TRUE((*opt)->Step().ok());
    // NOTE [Deferred loss]: the step leaves its loss on the device until read.
    absl::StatusOr<double> loss = out->ReadLoss();
    ASSERT_TRUE(loss.ok()) << loss.status();
    if (step == 0) first = *loss;
    last = *loss;
  }
  EXPECT_NEAR(first, std::log(256.0), 0.5);
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
  ctx.stage = Stage::kTest;
  ctx.step = 0;
  absl::StatusOr<StepOutput> eval = m.EvaluationStep(ctx);
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_LT(eval->loss, 0.5 * first);

  options.model.vocab_size = 64;  // ',' and '!' and letters are ids >= 64
  options.eval_data_path.clear();
  module = GptTrainModule::Create(options);
  ASSERT_TRUE(module.ok()) << module.status();
  ctx.stage = Stage::kFit;
  absl::Status bad = (*module)->TrainingStep(ctx).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("train.bin"));
  EXPECT_THAT(bad.message(), HasSubstr("vocabulary size 64"));

  options.data_path = dir + "/missing.bin";
  EXPECT_THAT(GptTrainModule::Create(options).status().message(),
              HasSubstr("GptModuleOptions.data_path"));

  // A file must hold one window of seq_len + 1 = 17 tokens (NOTE [Token windows]).
  options.data_path = write("train_again.bin", text);
  options.eval_data_path = write("short.bin", "sixteen  tokens.");
  EXPECT_THAT(GptTrainModule::Create(options).status().message(),
              HasSubstr("GptModuleOptions.eval_data_path: 16 tokens, fewer than seq_len + 1 = 17"));
}

// NOTE [Data identity]: the Markov language by every option that defines it, token files
// by paths, token counts, fingerprint and seed; the evaluation files are not in it.
TEST(GptTrainModuleTest, DataIdentityNamesWhatTheTrainingBatchesComeFrom) {
  GptModuleOptions options;
  options.language.seed = 5;
  options.language.order = 2;
  absl::StatusOr<std::unique_ptr<GptTrainModule>> module = GptTrainModule::Create(options);
  ASSERT_TRUE(module.ok()) << module.status();
  const std::map<std::string, std::string> language = {{"data.kind", "markov_language"},
                                                       {"data.language_seed", "5"},
                                                       {"data.order", "2"},
                                                       {"data.vocab", "64"},
                                                       {"data.likely_tokens", "4"},
                                                       {"data.peakedness", "6"},
                                                       {"data.seq_len", "32"}};
  EXPECT_EQ((*module)->DataIdentity(), language);
  options.language.peakedness = 6.25;
  options.seq_len = 16;
  module = GptTrainModule::Create(options);
  ASSERT_TRUE(module.ok()) << module.status();
  EXPECT_EQ((*module)->DataIdentity().at("data.peakedness"), "6.25");
  EXPECT_EQ((*module)->DataIdentity().at("data.seq_len"), "16");

  const std::string dir = TokensDir();
  std::string text;
  while (text.size() < 3000) text += "identity ";
  GptModuleOptions files;
  files.model.vocab_size = 256;
  files.data_path = WriteTokens(dir, "identity_train.bin", text);
  files.eval_data_path = WriteTokens(dir, "identity_eval.bin", text.substr(0, 100));
  files.data_seed = 9;
  module = GptTrainModule::Create(files);
  ASSERT_TRUE(module.ok()) << module.status();
  const absl::StatusOr<data::TokenFile> tokens = data::TokenFile::Open(files.data_path);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  const std::map<std::string, std::string> identity = (*module)->DataIdentity();
  const std::map<std::string, std::string> expected = {
      {"data.kind", "token_files"},
      {"data.files", files.data_path},
      {"data.sizes", "3006"},
      {"data.fingerprint", absl::StrFormat("0x%016x", tokens->Fingerprint())},
      {"data.seed", "9"},
      {"data.sampling", "epochs"},
      {"data.seq_len", "32"}};
  EXPECT_EQ(identity, expected);
  // NOTE [Data position]: 3005 / 32 = 93 windows; after 10 steps of 16 rows the next sample
  // is 160, window 67 of epoch 1. The language has none: its step is the position.
  EXPECT_EQ((*module)->DataPosition(10, 16),
            (std::map<std::string, std::string>{{"data.epoch", "1"}, {"data.window", "67"}}));
  EXPECT_EQ((*module)->DataPosition(0, 16),
            (std::map<std::string, std::string>{{"data.epoch", "0"}, {"data.window", "0"}}));
  const std::unique_ptr<GptTrainModule> markov = GptTrainModule::Create(options).value();
  EXPECT_TRUE(markov->DataPosition(10, 16).empty());
  // NOTE [Whole-set evaluation]: the eval file's 99 / 32 = 3 windows in one batch of 2 rows
  // and one padded; predict and the language keep StageOptions::eval_batches.
  EXPECT_EQ((*module)->EvaluationBatches(Stage::kTest, 2), std::optional<int64_t>(2));
  EXPECT_EQ((*module)->EvaluationBatches(Stage::kValidate, 3), std::optional<int64_t>(1));
  EXPECT_EQ((*module)->EvaluationBatches(Stage::kPredict, 2), std::nullopt);
  EXPECT_EQ(markov->EvaluationBatches(Stage::kTest, 2), std::nullopt);
  files.eval_data_path = "";  // evaluation reads the training file now: no training batch changes
  module = GptTrainModule::Create(files);
  ASSERT_TRUE(module.ok()) << module.status();
  EXPECT_EQ((*module)->DataIdentity(), identity);
}

}  // namespace
}  // namespace integration
