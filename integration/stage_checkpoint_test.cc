// Training checkpoints through the StageRunner, over thread ranks: a checkpoint saved
// at N = 2 loads at N = 1, 3 and 4 (and into a plain module) with the same weights and
// optimizer state; each rank reads only its part; a crash before the rename leaves the
// previous checkpoint loadable; bad input is refused naming the parameter; a resume on
// other data is refused naming the field (NOTE [Data identity]).
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/sharded.h"
#include "comm/testing/thread_ranks.h"
#include "core/status_macros.h"
#include "fsdp/fsdp.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/checkpointing/data_identity.h"
#include "integration/checkpointing/training_checkpoint.h"
#include "integration/forwarding_train_module.h"
#include "integration/gpt_module.h"
#include "integration/stage_runner.h"
#include "integration/testing/stage_testing.h"
#include "policy/wrap_policy.h"

namespace integration {
namespace {

using ::testing::HasSubstr;

using testing::RunRanks;

// Vocabulary 24 and width 24 make parameter sizes that 3 does not divide evenly, so
// N = 3 exercises padded shards; batches of 12 rows divide by 1, 2, 3 and 4.
GptModuleOptions SmallGpt() { return testing::TinyGpt(24, 24, 5); }
StageOptions Stages() { return testing::TinyStages(12, 4); }

std::string Dir(const std::string& name) { return ::testing::TempDir() + "/" + name; }

// Full values of every model parameter and optimizer state tensor of a checkpoint.
std::map<std::string, std::vector<float>> Contents(const std::string& dir) {
  std::map<std::string, std::vector<float>> out;
  absl::StatusOr<std::vector<std::pair<std::string, core::Tensor>>> all = checkpoint::LoadFull(dir);
  EXPECT_TRUE(all.ok()) << all.status();
  if (all.ok()) {
    for (const auto& [name, t] : *all) out[name] = t.ToVector();
  }
  return out;
}

// Fits 4 steps at N = 2 and saves "<name>"; returns its test loss.
double FitAndSave(const std::string& name) {
  double loss = 0;
  absl::Status s = RunRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(SmallGpt()));
    StageOptions o = Stages();
    o.checkpoint_dir = Dir(name);
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, o));
    RETURN_IF_ERROR(runner->Fit(*module).status());
    ASSIGN_OR_RETURN(EvalResult test, runner->Test(*module));
    if (ctx.rank == 0) loss = test.loss;
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return loss;
}

TEST(StageCheckpointTest, LoadsAtAnyWorldSizeWithTheSameWeightsAndOptimizerState) {
  const double saved_loss = FitAndSave("n2");
  const std::map<std::string, std::vector<float>> saved = Contents(Dir("n2"));
  ASSERT_TRUE(saved.count("model/wte.weight") && saved.count("optim/wte.weight/exp_avg_sq"));
  for (int n : {1, 3, 4}) {
    SCOPED_TRACE(absl::StrCat("N = ", n));
    std::vector<int64_t> bytes_read(n);
    INTEGRATION_ASSERT_OK(RunRanks(n, [&](comm::testing::RankContext& ctx) -> absl::Status {
      ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(SmallGpt()));
      ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, Stages()));
      ASSIGN_OR_RETURN(LoadedCheckpoint loaded,
                       runner->LoadCheckpoint(*module, Dir("n2"), /*optimizer=*/true));
      EXPECT_EQ(loaded.step, 4);
      EXPECT_EQ(loaded.saved_world_size, 2);
      EXPECT_TRUE(loaded.has_optimizer_state);
      EXPECT_EQ(loaded.optimizer_type, "AdamW");
      bytes_read[ctx.rank] = loaded.bytes_read;
      EXPECT_EQ(runner->GlobalStep(*module), 4) << "global step restored";
      EXPECT_EQ(runner->optimizer(*module)->step_count(), 4) << "step count restored";
      // Saving again at N gives the same tensors: model and optimizer state made it
      // through the resharding element for element.
      RETURN_IF_ERROR(runner->SaveCheckpoint(*module, Dir(absl::StrCat("resaved", n))));
      ASSIGN_OR_RETURN(EvalResult test, runner->Test(*module));
      // A different batch split changes float32 summation order (see main_job_e2e_test).
      EXPECT_LE(std::abs(test.loss - saved_loss), 1e-5 * saved_loss)
          << "test loss " << test.loss << " vs " << saved_loss;
      return absl::OkStatus();
    }));
    EXPECT_EQ(Contents(Dir(absl::StrCat("resaved", n))), saved);
    // Each rank reads its share plus at most one partial checksum block per chunk
    // boundary; with N >= 3, well under the whole data.
    int64_t total_bytes = 0;
    for (const auto& [name, values] : saved) total_bytes += 4 * values.size();
    for (int r = 0; r < n && n >= 3; ++r) {
      EXPECT_LT(bytes_read[r], total_bytes) << "rank " << r;
    }
  }
}

TEST(StageCheckpointTest, LoadsIntoAPlainModule) {
  FitAndSave("plain");
  absl::StatusOr<std::unique_ptr<GptTrainModule>> module = GptTrainModule::Create(SmallGpt());
  ASSERT_TRUE(module.ok());
  fsdp::WrapperRegistry registry;
  absl::StatusOr<LoadedCheckpoint> loaded =
      LoadTrainingCheckpoint(Dir("plain"), *(*module)->model(), &registry);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::map<std::string, std::vector<float>> saved = Contents(Dir("plain"));
  for (const auto& [name, p] : (*module)->model()->NamedParameters()) {
    EXPECT_EQ(p->data.ToVector(), saved.at("model/" + name)) << name;
  }
}

// NOTE [Deferred initialisation]: a deferred model loads a checkpoint into its shards
// (the stage wraps it, filling shards only, then each rank reads its ranges) without
// ever holding the full model; a plain deferred model refuses, naming the parameter.
TEST(StageCheckpointTest, LoadsIntoADeferredModelWithoutTheFullModel) {
  FitAndSave("deferred");
  const std::map<std::string, std::vector<float>> saved = Contents(Dir("deferred"));
  int64_t full_model_bytes = 0;
  for (const auto& [name, values] : saved) {
    if (absl::StartsWith(name, "model/")) full_model_bytes += 4 * values.size();
  }
  GptModuleOptions deferred = SmallGpt();
  deferred.deferred_init = true;
  const int n = 3;
  std::vector<int64_t> param_peaks(n);
  INTEGRATION_ASSERT_OK(RunRanks(n, [&](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(deferred));
    ctx.allocator->ResetPeaks();
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, Stages()));
    ASSIGN_OR_RETURN(LoadedCheckpoint loaded,
                     runner->LoadCheckpoint(*module, Dir("deferred"), /*optimizer=*/true));
    param_peaks[ctx.rank] = ctx.allocator->Stats().peak(core::MemoryTag::kParam);
    RETURN_IF_ERROR(runner->SaveCheckpoint(*module, Dir("deferred_resaved")));
    return absl::OkStatus();
  }));
  EXPECT_EQ(Contents(Dir("deferred_resaved")), saved);
  for (int r = 0; r < n; ++r) {
    // Its shards: a third of the model, plus padding.
    EXPECT_LT(param_peaks[r], full_model_bytes / 2) << "rank " << r;
  }

  absl::StatusOr<std::unique_ptr<GptTrainModule>> plain = GptTrainModule::Create(deferred);
  ASSERT_TRUE(plain.ok()) << plain.status();
  fsdp::WrapperRegistry registry;
  absl::StatusOr<LoadedCheckpoint> refused =
      LoadTrainingCheckpoint(Dir("deferred"), *(*plain)->model(), &registry);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("parameter 'wte.weight' is deferred and not materialized"));
}

TEST(StageCheckpointTest, CrashBeforeRenameLeavesThePreviousCheckpointLoadable) {
  const double first_loss = FitAndSave("crash");
  const std::map<std::string, std::vector<float>> first = Contents(Dir("crash"));
  INTEGRATION_ASSERT_OK(RunRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(SmallGpt()));
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, Stages()));
    RETURN_IF_ERROR(runner->LoadCheckpoint(*module, Dir("crash"), true).status());
    RETURN_IF_ERROR(runner->Fit(*module).status());  // newer weights
    absl::Status crashed =
        runner->SaveCheckpoint(*module, Dir("crash"), checkpoint::SimulatedCrash::kBeforeRename);
    EXPECT_EQ(crashed.code(), absl::StatusCode::kAborted) << crashed;
    return absl::OkStatus();
  }));
  EXPECT_EQ(Contents(Dir("crash")), first);
  INTEGRATION_ASSERT_OK(RunRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(SmallGpt()));
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, Stages()));
    ASSIGN_OR_RETURN(LoadedCheckpoint loaded, runner->LoadCheckpoint(*module, Dir("crash"), false));
    ASSIGN_OR_RETURN(EvalResult test, runner->Test(*module));
    EXPECT_EQ(loaded.step, 4);
    EXPECT_EQ(test.loss, first_loss);
    return absl::OkStatus();
  }));
  absl::StatusOr<int> cleaned = checkpoint::CleanUpInterruptedSaves(Dir("crash"));
  ASSERT_TRUE(cleaned.ok()) << cleaned.status();
  EXPECT_EQ(*cleaned, 1) << "the interrupted save's temporary directory";
}

TEST(StageCheckpointTest, CorruptedDataIsRefusedNamingTheFileAndTensor) {
  FitAndSave("corrupt");
  absl::StatusOr<checkpoint::CheckpointInfo> info = checkpoint::ReadMetadata(Dir("corrupt"));
  ASSERT_TRUE(info.ok()) << info.status();
  const std::string file = Dir("corrupt") + "/rank-00000-of-00002.bin";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    char c;
    f.seekg(0);
    f.get(c);
    f.seekp(0);
    f.put(static_cast<char>(c ^ 0x01));
  }
  absl::StatusOr<std::unique_ptr<GptTrainModule>> module = GptTrainModule::Create(SmallGpt());
  ASSERT_TRUE(module.ok());
  const std::vector<float> before =
      (*module)->model()->NamedParameters()[0].second->data.ToVector();
  fsdp::WrapperRegistry registry;
  absl::StatusOr<LoadedCheckpoint> loaded =
      LoadTrainingCheckpoint(Dir("corrupt"), *(*module)->model(), &registry);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  const std::string message(loaded.status().message());
  EXPECT_NE(message.find("rank-00000-of-00002.bin"), std::string::npos) << message;
  // Rank 0's file starts with the first tensor rank 0 saved: the first parameter.
  EXPECT_NE(message.find("model/wte.weight"), std::string::npos) << message;
  EXPECT_EQ((*module)->model()->NamedParameters()[0].second->data.ToVector(), before)
      << "nothing written on failure";
}

TEST(StageCheckpointTest, ErrorsNameTheParameterOrTheMissingState) {
  // Saved without an optimizer: model-only loads work, optimizer loads are refused.
  INTEGRATION_ASSERT_OK(RunRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(SmallGpt()));
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, Stages()));
    RETURN_IF_ERROR(runner->Wrap(*module).status());
    return runner->SaveCheckpoint(*module, Dir("no_optim"));
  }));
  absl::StatusOr<LoadedCheckpoint> info = ReadTrainingCheckpointInfo(Dir("no_optim"));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->has_optimizer_state);
  INTEGRATION_ASSERT_OK(RunRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(SmallGpt()));
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, Stages()));
    absl::Status s = runner->LoadCheckpoint(*module, Dir("no_optim"), true).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.ToString(), HasSubstr("no optimizer state"));
    return absl::OkStatus();
  }));
  // A model with another shape: FailedPrecondition (another structure) naming the parameter.
  GptModuleOptions wider = SmallGpt();
  wider.model.n_embd = 32;
  absl::StatusOr<std::unique_ptr<GptTrainModule>> other = GptTrainModule::Create(wider);
  ASSERT_TRUE(other.ok());
  fsdp::WrapperRegistry registry;
  absl::Status s = LoadTrainingCheckpoint(Dir("no_optim"), *(*other)->model(), &registry).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.ToString().find("'wte.weight'"), std::string::npos) << s;
  // Reserved metadata keys.
  absl::StatusOr<std::unique_ptr<GptTrainModule>> m = GptTrainModule::Create(SmallGpt());
  TrainingCheckpointOptions reserved;
  reserved.user_metadata["fsdp.mine"] = "x";
  s = SaveTrainingCheckpoint(Dir("reserved"), *(*m)->model(), &registry, nullptr, nullptr,
                             reserved);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_FALSE(std::filesystem::exists(Dir("reserved")));
}

// ---------------------------------------------------------------------------------
// NOTE [Data identity]: a resume reads the checkpoint's data, or is refused naming the
// field, unless asked to load anyway; a model-only load compares nothing.

// `tokens` pseudo-random tokens below 24 (SmallGpt's vocabulary) from `seed`, as a bare
// uint16 (nanoGPT) file at `path`.
void WriteTokens(const std::string& path, int tokens, uint32_t seed) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  uint32_t x = seed * 2654435761u + 12345u;
  for (int i = 0; i < tokens; ++i) {
    x = x * 1664525u + 1013904223u;
    const uint16_t t = static_cast<uint16_t>((x >> 16) % 24);
    out.write(reinterpret_cast<const char*>(&t), 2);
  }
}

GptModuleOptions OnTokens(const std::string& path, uint64_t data_seed) {
  GptModuleOptions o = SmallGpt();
  o.data_path = path;
  o.data_seed = data_seed;
  return o;
}

// Fits 4 steps of `options` at N = 2 and saves to Dir(name).
void FitAndSaveWith(const GptModuleOptions& options, const std::string& name) {
  INTEGRATION_ASSERT_OK(RunRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(options));
    StageOptions o = Stages();
    o.checkpoint_dir = Dir(name);
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, o));
    return runner->Fit(*module).status();
  }));
}

// Each rank's LoadCheckpoint of Dir(name) into a module of `options(rank)` at N = 2, and
// the module's global step after it.
struct RankLoad {
  absl::StatusOr<LoadedCheckpoint> loaded = absl::UnknownError("not run");
  int64_t global_step = -1;
};
std::vector<RankLoad> LoadOnRanks(const std::string& name,
                                  const std::function<GptModuleOptions(int)>& options,
                                  const LoadCheckpointOptions& load,
                                  const StageOptions& stages = Stages()) {
  std::vector<RankLoad> out(2);
  absl::Status s = RunRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(options(ctx.rank)));
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, stages));
    out[ctx.rank].loaded = runner->LoadCheckpoint(*module, Dir(name), load);
    out[ctx.rank].global_step = runner->GlobalStep(*module);
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

LoadCheckpointOptions Resume(bool allow_data_change = false) {
  LoadCheckpointOptions o;
  o.optimizer = true;
  o.allow_data_change = allow_data_change;
  return o;
}

std::vector<std::string> ChangedKeys(const LoadedCheckpoint& loaded) {
  std::vector<std::string> keys;
  for (const DataIdentityChange& c : loaded.data_identity_changes) keys.push_back(c.key);
  return keys;
}

TEST(StageCheckpointTest, AResumeOnOtherTokenFilesOrSeedIsRefusedNamingTheField) {
  const std::string path = Dir("identity_tokens.bin");
  WriteTokens(path, 4000, /*seed=*/1);  // A
  FitAndSaveWith(OnTokens(path, 7), "identity");
  absl::StatusOr<LoadedCheckpoint> info = ReadTrainingCheckpointInfo(Dir("identity"));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->data_identity.at("data.files"), path);
  EXPECT_EQ(info->data_identity.at("data.seed"), "7");

  // The same files and seed: resumes, nothing to report.
  for (const RankLoad& r : LoadOnRanks(
           "identity", [&](int) { return OnTokens(path, 7); }, Resume())) {
    ASSERT_TRUE(r.loaded.ok()) << r.loaded.status();
    EXPECT_TRUE(r.loaded->data_identity_changes.empty());
    EXPECT_EQ(r.loaded->data_identity_note, "");
    EXPECT_EQ(r.global_step, 4);
  }

  // Another seed on rank 1 only: every rank fails with rank 1's error, nothing loaded.
  for (const RankLoad& r : LoadOnRanks(
           "identity", [&](int rank) { return OnTokens(path, rank == 1 ? 8 : 7); }, Resume())) {
    EXPECT_EQ(r.loaded.status().code(), absl::StatusCode::kFailedPrecondition) << r.loaded.status();
    EXPECT_THAT(std::string(r.loaded.status().message()),
                HasSubstr("rank 1: loading checkpoint '" + Dir("identity") +
                          "': the module's data differ from the checkpoint's"));
    EXPECT_THAT(std::string(r.loaded.status().message()),
                HasSubstr("data.seed: the checkpoint's 7 vs this module's 8"));
    EXPECT_EQ(r.global_step, 0);
  }

  // B: other content of the same size at the same path: only the fingerprint tells.
  const std::string a_fingerprint = info->data_identity.at("data.fingerprint");
  WriteTokens(path, 4000, /*seed=*/2);
  for (const RankLoad& r : LoadOnRanks(
           "identity", [&](int) { return OnTokens(path, 7); }, Resume())) {
    EXPECT_EQ(r.loaded.status().code(), absl::StatusCode::kFailedPrecondition) << r.loaded.status();
    const std::string message(r.loaded.status().message());
    EXPECT_THAT(message, HasSubstr("data.fingerprint: the checkpoint's " + a_fingerprint +
                                   " vs this module's 0x"));
    EXPECT_THAT(message, ::testing::Not(HasSubstr("data.sizes")));
    EXPECT_THAT(message, ::testing::Not(HasSubstr("data.files")));
    EXPECT_EQ(r.global_step, 0);
  }

  // Asked to, it loads anyway and lists what differs.
  for (const RankLoad& r : LoadOnRanks(
           "identity", [&](int) { return OnTokens(path, 8); },
           Resume(/*allow_data_change=*/true))) {
    ASSERT_TRUE(r.loaded.ok()) << r.loaded.status();
    ASSERT_EQ(ChangedKeys(*r.loaded), (std::vector<std::string>{"data.fingerprint", "data.seed"}));
    EXPECT_EQ(r.loaded->data_identity_changes[1].saved, std::optional<std::string>("7"));
    EXPECT_EQ(r.loaded->data_identity_changes[1].current, std::optional<std::string>("8"));
    EXPECT_EQ(r.global_step, 4);
  }

  // A model-only load (evaluation, the start of a fine-tuning) compares nothing.
  for (const RankLoad& r : LoadOnRanks(
           "identity", [&](int) { return OnTokens(path, 8); }, LoadCheckpointOptions())) {
    ASSERT_TRUE(r.loaded.ok()) << r.loaded.status();
    EXPECT_TRUE(r.loaded->data_identity_changes.empty());
    EXPECT_EQ(r.loaded->data_identity_note, "");
    EXPECT_EQ(r.global_step, 4);
  }
}

// NOTE [Data position]: the checkpoint records where in the epochs the run stands; a resume
// whose batch size would read other samples from the saved step is refused naming it.
TEST(StageCheckpointTest, AResumeAtAnotherPositionInTheEpochsIsRefusedNamingIt) {
  const std::string path = Dir("position_tokens.bin");
  WriteTokens(path, 4000, /*seed=*/1);  // (4000 - 1) / 8 = 499 windows
  FitAndSaveWith(OnTokens(path, 7), "position");
  absl::StatusOr<LoadedCheckpoint> info = ReadTrainingCheckpointInfo(Dir("position"));
  ASSERT_TRUE(info.ok()) << info.status();
  // 4 steps of 12 rows: the next sample is 48, window 48 of epoch 0.
  EXPECT_EQ(info->data_position,
            (std::map<std::string, std::string>{{"data.epoch", "0"}, {"data.window", "48"}}));
  EXPECT_EQ(info->data_identity.at("data.sampling"), "epochs");
  for (const RankLoad& r : LoadOnRanks(
           "position", [&](int) { return OnTokens(path, 7); }, Resume())) {
    ASSERT_TRUE(r.loaded.ok()) << r.loaded.status();
    EXPECT_TRUE(r.loaded->data_identity_changes.empty());
    EXPECT_EQ(r.loaded->data_identity_note, "");
    EXPECT_EQ(r.loaded->data_position, info->data_position);
  }
  StageOptions doubled = Stages();
  doubled.train_batch_size = 24;  // step 4 would start at sample 96
  for (const RankLoad& r : LoadOnRanks(
           "position", [&](int) { return OnTokens(path, 7); }, Resume(), doubled)) {
    EXPECT_EQ(r.loaded.status().code(), absl::StatusCode::kFailedPrecondition) << r.loaded.status();
    EXPECT_THAT(std::string(r.loaded.status().message()),
                HasSubstr("data.window: the checkpoint's 48 vs this module's 96"));
    EXPECT_EQ(r.global_step, 0);
  }
  for (const RankLoad& r : LoadOnRanks(
           "position", [&](int) { return OnTokens(path, 7); }, Resume(true), doubled)) {
    ASSERT_TRUE(r.loaded.ok()) << r.loaded.status();
    EXPECT_EQ(ChangedKeys(*r.loaded), (std::vector<std::string>{"data.window"}));
    EXPECT_EQ(r.global_step, 4);
  }
  // A model-only load compares no position either.
  for (const RankLoad& r : LoadOnRanks(
           "position", [&](int) { return OnTokens(path, 7); }, LoadCheckpointOptions(), doubled)) {
    ASSERT_TRUE(r.loaded.ok()) << r.loaded.status();
    EXPECT_TRUE(r.loaded->data_identity_changes.empty());
  }
}

TEST(StageCheckpointTest, AResumeOnAnotherLanguageIsRefusedNamingTheField) {
  FitAndSaveWith(SmallGpt(), "identity_language");
  GptModuleOptions other = SmallGpt();
  other.language.seed += 1;
  for (const RankLoad& r : LoadOnRanks(
           "identity_language", [&](int) { return other; }, Resume())) {
    EXPECT_EQ(r.loaded.status().code(), absl::StatusCode::kFailedPrecondition) << r.loaded.status();
    EXPECT_THAT(
        std::string(r.loaded.status().message()),
        HasSubstr(absl::StrCat("data.language_seed: the checkpoint's ", SmallGpt().language.seed,
                               " vs this module's ", other.language.seed)));
  }
  // Token files in place of the language: every key of either differs.
  const std::string path = Dir("identity_language_tokens.bin");
  WriteTokens(path, 4000, 1);
  for (const RankLoad& r : LoadOnRanks(
           "identity_language", [&](int) { return OnTokens(path, 7); }, Resume(true))) {
    ASSERT_TRUE(r.loaded.ok()) << r.loaded.status();
    EXPECT_THAT(ChangedKeys(*r.loaded), ::testing::Contains("data.kind"));
    EXPECT_THAT(ChangedKeys(*r.loaded), ::testing::Contains("data.fingerprint"));
    EXPECT_THAT(ChangedKeys(*r.loaded), ::testing::Contains("data.language_seed"));
  }
}

// A TrainModule that gives no data identity, as every checkpoint saved before
// checkpoints kept one.
class NoDataIdentity : public ForwardingTrainModule {
 public:
  using ForwardingTrainModule::ForwardingTrainModule;
  std::map<std::string, std::string> DataIdentity() const override { return {}; }
};

TEST(StageCheckpointTest, ACheckpointWithoutADataIdentityResumesWithANote) {
  const std::string path = Dir("identity_none_tokens.bin");
  WriteTokens(path, 4000, 1);
  INTEGRATION_ASSERT_OK(RunRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(OnTokens(path, 7)));
    NoDataIdentity silent(module.get());
    StageOptions o = Stages();
    o.checkpoint_dir = Dir("identity_none");
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, o));
    return runner->Fit(silent).status();
  }));
  absl::StatusOr<LoadedCheckpoint> info = ReadTrainingCheckpointInfo(Dir("identity_none"));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->data_identity.empty());
  for (const RankLoad& r : LoadOnRanks(
           "identity_none", [&](int) { return OnTokens(path, 8); }, Resume())) {
    ASSERT_TRUE(r.loaded.ok()) << r.loaded.status();
    EXPECT_TRUE(r.loaded->data_identity_changes.empty());
    EXPECT_THAT(r.loaded->data_identity_note, HasSubstr("the checkpoint records no data identity"));
    EXPECT_EQ(r.global_step, 4);
  }
}

}  // namespace
}  // namespace integration
