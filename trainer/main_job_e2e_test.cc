// End-to-end tests of the stage APIs with real processes: the main job starts its ranks
// through the local launcher (or is started by //comm:launch), and the stages run in
// separate jobs share nothing but the checkpoint directory.
//
//   fit + test in one run      -> the test stage reuses the fit's units, copies nothing,
//                                 and the released plain module gives the same loss;
//   test alone from checkpoint -> a fresh wrap, the same test loss (world size 2);
//   test at world size 1 and 4 -> the same test loss within fp32 tolerance;
//   fit 20 + resume 20         -> the same losses and weights as fit 40;
//   resume with another --seed -> refused naming the field, unless allowed;
//   token files                -> test covers the evaluation file, the same bits at N = 1,
//                                 2 and 4; the resume names the data position;
//   safetensors of the run     -> round-trips, header as published, equal to the checkpoint;
//   a corrupted / truncated checkpoint file -> refused, naming the file and the tensor.
//
// The runs share one small model (2 blocks, width 32) so that each takes seconds.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/series.h"
#include "checkpoint/sharded.h"
#include "core/roofline.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "trainer/testing/e2e_harness.h"

namespace integration {
namespace {

using testing::MainJob;
using testing::ReadFile;
using testing::RunCommand;
using testing::Runfile;
using testing::RunResult;
using testing::RunRetryingPortRace;
using testing::TempDir;

// |a - b| <= rtol |b|, for losses computed with other batch splits. Each rank's loss is a
// float32 mean over its tokens; a different split changes how those float32 sums group
// (and the GEMM shapes), so results differ by a few float32 roundings (~1e-7 relative
// each) of a loss near 2: 1e-5 leaves a wide margin while any real difference in the
// weights (a wrong shard, a missed update) changes the loss far more.
constexpr double kCrossWorldRtol = 1e-5;

double Num(const nlohmann::json& j, const char* key) { return j.at(key).get<double>(); }

// Shared by the tests: one fit+test run at world size 2, done once.
class MainJobTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    base_ = TempDir() + "/fit";
    fit_ = new RunResult(MainJob(2, base_, {"--stages=fit,test", "--steps=40", "--profile_ops"}));
  }
  static void TearDownTestSuite() { delete fit_; }

  void SetUp() override {
    ASSERT_EQ(fit_->exit_code, 0) << fit_->output;
    ASSERT_TRUE(fit_->summary.is_object()) << fit_->output;
  }

  static std::string base_;
  static RunResult* fit_;
};
std::string MainJobTest::base_;
RunResult* MainJobTest::fit_ = nullptr;

TEST_F(MainJobTest, FitThenTestReusesTheUnitsAndTheReleasedModuleAgrees) {
  const nlohmann::json& s = fit_->summary;
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_EQ(s["units_reused"], 3) << "2 TransformerBlocks + the root";
  EXPECT_EQ(s["test_wrap_reused"], true);
  EXPECT_EQ(s["param_bytes_copied_on_rewrap"], 0);
  EXPECT_EQ(s["fresh_wraps"], 1);
  EXPECT_EQ(s["global_step"], 40);
  // The released plain module computes with the same values: only the storage differs.
  EXPECT_NEAR(Num(s, "released_test_loss"), Num(s, "test_loss"), 1e-6 * Num(s, "test_loss"));
  // It learnt: well below log V and falling.
  EXPECT_LT(Num(s, "test_loss"), std::log(32.0) - 0.5);
  nlohmann::json file = nlohmann::json::parse(ReadFile(base_ + "/summary.json"));
  const auto& losses = file["fit_losses"];
  ASSERT_EQ(losses.size(), 40u);
  EXPECT_LT(losses[39].get<double>(), losses[0].get<double>() - 0.5);
  // The device fields: a CPU run has no device memory and no MFU; the throughput after
  // the warm-up (min(5, 40 / 10) = 4 steps) is measured.
  EXPECT_EQ(s["device"], "cpu");
  EXPECT_TRUE(s["mfu"].is_null());
  EXPECT_TRUE(s["peak_device_memory_bytes"].is_null());
  EXPECT_EQ(s["warmup_steps_excluded"], 4);
  EXPECT_GT(Num(s, "tokens_per_second_after_warmup"), 0);
  // The device-timed figure is CUDA events': a CPU run has none.
  EXPECT_FALSE(s.contains("device_timed")) << s.dump();
  EXPECT_EQ(fit_->output.find("device-timed"), std::string::npos) << fit_->output;
  EXPECT_EQ(s["mfu_inputs"]["L"], 2);
  EXPECT_GT(s["mfu_inputs"]["flops_per_token"].get<double>(),
            6.0 * s["model_parameters"].get<double>());
  for (const char* key : {"world_size", "final_train_loss", "test_loss", "released_test_loss",
                          "entropy_floor", "units_reused", "param_bytes_copied_on_rewrap",
                          "peak_bytes_per_rank", "checkpoint_dir", "safetensors_path"}) {
    EXPECT_TRUE(s.contains(key)) << key;
  }
  ASSERT_EQ(s["peak_bytes_per_rank"].size(), 2u);
  EXPECT_GT(s["peak_bytes_per_rank"][1]["param"].get<int64_t>(), 0);
  // The progress lines and the charts.
  EXPECT_NE(fit_->output.find("step    10/40"), std::string::npos) << fit_->output;
  // The GPT counts tokens, and the main job's TrainModule wrappers pass that on: every
  // progress line gives tokens/s (not TrainModule's default "samples/s").
  int progress_lines = 0;
  for (absl::string_view line : absl::StrSplit(fit_->output, '\n')) {
    if (!absl::StrContains(line, " (global ")) continue;
    ++progress_lines;
    EXPECT_TRUE(absl::StrContains(line, "  tokens/s ")) << line;
  }
  EXPECT_EQ(progress_lines, 4) << fit_->output;  // steps 10, 20, 30, 40
  const std::string loss_svg = ReadFile(base_ + "/loss.svg");
  EXPECT_NE(loss_svg.find("<svg"), std::string::npos);
  EXPECT_NE(loss_svg.find("entropy floor"), std::string::npos);
  EXPECT_NE(ReadFile(base_ + "/memory.svg").find("rank 1"), std::string::npos);
}

// --profile_ops: the last fit step's ops per category, with the roofline estimate (no
// device time on the CPU), in summary.json and on stdout.
TEST_F(MainJobTest, ProfileOpsReportsTheLastFitStepsOpsPerCategory) {
  const nlohmann::json& p = fit_->summary["op_profile"];
  ASSERT_TRUE(p.is_object()) << fit_->output;
  std::map<std::string, nlohmann::json> by_category;
  for (const nlohmann::json& c : p["categories"]) by_category[c["category"]] = c;
  for (const char* category : {"gemm.forward", "gemm.input_grad", "gemm.weight_grad", "attention",
                               "norm", "loss", "optimizer", "collective"}) {
    ASSERT_TRUE(by_category.count(category)) << category << ": " << p.dump();
    EXPECT_GT(by_category[category]["ops"].get<int>(), 0) << category;
    EXPECT_GT(by_category[category]["estimated_ms"].get<double>(), 0) << category;
    EXPECT_TRUE(by_category[category]["measured_ms"].is_null()) << category;
  }
  // One AdamW update for the rank's shards; two TransformerBlocks' GEMMs plus lm_head.
  EXPECT_EQ(by_category["optimizer"]["ops"], 1);
  EXPECT_EQ(by_category["gemm.forward"]["ops"], 2 * 4 + 1);
  EXPECT_GT(Num(p, "estimated_step_ms"), 0);
  EXPECT_TRUE(p["measured_op_ms"].is_null());
  EXPECT_NE(fit_->output.find("op profile of fit step 40"), std::string::npos) << fit_->output;
  // A CPU has no rates of its own (NOTE [Rate sets] in core/roofline.h): the H200's, said.
  ASSERT_TRUE(p["rates_note"].is_string()) << p.dump();
  EXPECT_NE(p["rates_note"].get<std::string>().find("\"cpu\""), std::string::npos);
  EXPECT_EQ(p["rates"]["device"], core::H200Rates(core::RateSet::kCalibrated).name);
}

// --throughput_warmup_steps sets the steps the throughput leaves out; a value that leaves
// no step timed is refused by the parent, naming the flag, before any rank starts.
TEST(MainJobThroughputTest, ThroughputWarmupStepsIsTheWarmUpExcludedOrRefusedNamingTheFlag) {
  RunResult r =
      MainJob(1, TempDir() + "/throughput_warmup",
              {"--stages=fit", "--steps=8", "--throughput_warmup_steps=3", "--release=false"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.summary["warmup_steps_excluded"], 3);  // the default would be min(5, 8 / 10) = 0
  EXPECT_GT(Num(r.summary, "tokens_per_second_after_warmup"), 0);
  EXPECT_FALSE(r.summary.contains("device_timed")) << r.summary.dump();
  for (const char* bad : {"-1", "7"}) {
    RunResult refused =
        MainJob(1, TempDir() + "/throughput_warmup_bad",
                {"--stages=fit", "--steps=8", absl::StrCat("--throughput_warmup_steps=", bad)});
    EXPECT_NE(refused.exit_code, 0) << refused.output;
    EXPECT_TRUE(absl::StrContains(refused.output,
                                  absl::StrCat("--throughput_warmup_steps=", bad, " must be in")))
        << refused.output;
    EXPECT_FALSE(absl::StrContains(refused.output, "starting 1 local ranks")) << refused.output;
  }
}

TEST_F(MainJobTest, TestAloneFromTheCheckpointWrapsFreshAndGetsTheSameLoss) {
  RunResult alone =
      MainJob(2, TempDir() + "/alone",
              {"--stages=test", "--resume_from=" + base_ + "/checkpoint", "--release=false"});
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  EXPECT_EQ(alone.summary["fresh_wraps"], 1);
  EXPECT_EQ(alone.summary["global_step"], 40);
  // Same world size and layout, same values: the same arithmetic, so exactly equal.
  EXPECT_EQ(Num(alone.summary, "test_loss"), Num(fit_->summary, "test_loss"));
}

TEST_F(MainJobTest, StageConfigFileSetsTheStagesOptions) {
  // A text-format StageConfig overrides the flags: the test stage runs under
  // SHARD_GRAD_OP over the FULL_SHARD run's checkpoint, on the same weights and the same
  // batch split, so the loss is the same to the last bit.
  const std::string config = TempDir() + "/stage_config.txtpb";
  std::ofstream(config) << "strategy: \"SHARD_GRAD_OP\"\neval_batches: 4\n";
  RunResult r = MainJob(2, TempDir() + "/configured",
                        {"--stages=test", "--resume_from=" + base_ + "/checkpoint",
                         "--stage_config=" + config, "--strategy=NO_SHARD"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.summary["strategy"], "SHARD_GRAD_OP");
  EXPECT_EQ(Num(r.summary, "test_loss"), Num(fit_->summary, "test_loss"));
  // A config with an error is refused naming the field, before any rank trains.
  std::ofstream(config) << "strategy: \"ZERO3\"\n";
  RunResult bad =
      MainJob(2, TempDir() + "/configured", {"--stages=test", "--stage_config=" + config});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("StageConfig.strategy"), std::string::npos) << bad.output;
}

TEST_F(MainJobTest, TestAtWorldSizesOneAndFourFromTheWorldSizeTwoCheckpoint) {
  RunResult one =
      MainJob(1, TempDir() + "/ws1", {"--stages=test", "--resume_from=" + base_ + "/checkpoint"});
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(one.summary["world_size"], 1);
  EXPECT_NEAR(Num(one.summary, "test_loss"), Num(fit_->summary, "test_loss"),
              kCrossWorldRtol * Num(fit_->summary, "test_loss"));

  // World size 4 started by the stand-alone launcher: the job sees RANK and friends, and
  // rank 0 prints the summary itself.
  std::vector<std::string> argv = {Runfile("comm/launch"),
                                   "--nproc=4",
                                   "--",
                                   Runfile("trainer/main_job"),
                                   "--output_dir=" + TempDir() + "/ws4",
                                   "--stages=test",
                                   "--resume_from=" + base_ + "/checkpoint"};
  for (const std::string& f : testing::SmallModelFlags()) argv.push_back(f);
  RunResult four = RunRetryingPortRace(argv);
  ASSERT_EQ(four.exit_code, 0) << four.output;
  EXPECT_EQ(four.summary["world_size"], 4) << four.output;
  EXPECT_NEAR(Num(four.summary, "test_loss"), Num(fit_->summary, "test_loss"),
              kCrossWorldRtol * Num(fit_->summary, "test_loss"));
  EXPECT_NEAR(Num(four.summary, "released_test_loss"), Num(fit_->summary, "test_loss"),
              kCrossWorldRtol * Num(fit_->summary, "test_loss"));
}

TEST_F(MainJobTest, TrainingAtWorldSizesOneAndFourGivesTheWorldSizeTwoLosses) {
  // The same global batches, each rank's loss the mean over its rows and the gradients
  // averaged over ranks: N ranks compute the 1-rank numbers up to float32 rounding
  // (measured: 8.5e-8 relative at most over 300 steps of the default model).
  nlohmann::json two = nlohmann::json::parse(ReadFile(base_ + "/summary.json"))["fit_losses"];
  for (int n : {1, 4}) {
    const std::string out = TempDir() + "/train" + std::to_string(n);
    RunResult r = MainJob(n, out, {"--stages=fit", "--steps=40", "--release=false"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    nlohmann::json losses = nlohmann::json::parse(ReadFile(out + "/summary.json"))["fit_losses"];
    ASSERT_EQ(losses.size(), two.size());
    double worst = 0;
    for (size_t i = 0; i < losses.size(); ++i) {
      const double a = losses[i].get<double>(), b = two[i].get<double>();
      EXPECT_NEAR(a, b, kCrossWorldRtol * b) << "N = " << n << ", step " << i + 1;
      worst = std::max(worst, std::abs(a - b) / b);
    }
    std::printf("N = %d: largest relative loss difference to N = 2 over 40 steps: %.3g\n", n,
                worst);
  }
}

TEST_F(MainJobTest, ResumedTrainingEqualsUninterruptedTraining) {
  const std::string first = TempDir() + "/first20";
  RunResult a = MainJob(2, first, {"--stages=fit", "--steps=20", "--release=false"});
  ASSERT_EQ(a.exit_code, 0) << a.output;
  RunResult b =
      MainJob(2, TempDir() + "/next20",
              {"--stages=fit,test", "--steps=20", "--resume_from=" + first + "/checkpoint"});
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(b.summary["global_step"], 40);
  // Same batches (indexed by the global step), learning rates, optimizer state and
  // arithmetic as the uninterrupted run: the losses and the final loss are identical.
  const std::vector<double> straight = testing::FitLosses(base_);
  const std::vector<double> resumed = testing::FitLosses(TempDir() + "/next20");
  ASSERT_EQ(straight.size(), 40u);
  ASSERT_EQ(resumed.size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(resumed[i], straight[20 + i]) << "step " << 21 + i;
  EXPECT_EQ(Num(b.summary, "test_loss"), Num(fit_->summary, "test_loss"));
  // And the same weights, byte for byte.
  const absl::Status same = testing::SameSafetensors(base_ + "/model.safetensors",
                                                     TempDir() + "/next20/model.safetensors");
  EXPECT_TRUE(same.ok()) << same;
}

TEST_F(MainJobTest, PeriodicCheckpointsResumeFromTheLatest) {
  // 30 steps saving every 10, keeping 2; then --resume_from=latest continues at step 30.
  const std::string first = TempDir() + "/periodic30";
  RunResult a = MainJob(2, first,
                        {"--stages=fit", "--steps=30", "--checkpoint_every_steps=10",
                         "--keep_checkpoints=2", "--release=false"});
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string root = first + "/checkpoint";
  absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> kept =
      checkpoint::ListStepCheckpoints(root);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_EQ(kept->size(), 2u);
  EXPECT_EQ((*kept)[0].first, 20);
  EXPECT_EQ((*kept)[1].first, 30);
  RunResult b = MainJob(2, TempDir() + "/periodic_next10",
                        {"--stages=fit,test", "--steps=10", "--resume_from=latest",
                         "--checkpoint_dir=" + root, "--checkpoint_every_steps=10"});
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(b.summary["resumed_from"], checkpoint::StepDirectory(root, 30));
  EXPECT_EQ(b.summary["global_step"], 40);
  const std::vector<double> straight = testing::FitLosses(base_);
  const std::vector<double> resumed = testing::FitLosses(TempDir() + "/periodic_next10");
  ASSERT_EQ(resumed.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(resumed[i], straight[30 + i]) << "step " << 31 + i;
  // An empty checkpoint directory: the run starts fresh and says so.
  RunResult c = MainJob(2, TempDir() + "/periodic_fresh",
                        {"--stages=fit", "--steps=2", "--resume_from=latest"});
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("no complete checkpoint under"), std::string::npos) << c.output;
  EXPECT_TRUE(c.summary["resumed_from"].is_null());
}

// NOTE [Restarts] (comm/launcher.h): rank 1 is killed at step 12 of the first start; the
// launcher reports it and starts the job again, which resumes from step 10's checkpoint,
// trains to --max_steps on the uninterrupted run's numbers, and counts what the failure cost
// (NOTE [Run log]).
TEST_F(MainJobTest, AKilledRankRestartsTheJobFromTheNewestCheckpoint) {
  const std::string out = TempDir() + "/restarted";
  RunResult r = MainJob(2, out,
                        {"--stages=fit", "--max_steps=20", "--release=false", "--log_every=1",
                         "--checkpoint_every_steps=5", "--resume_from=latest", "--max_restarts=1",
                         "--testonly_fault=kill@1:12"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("root cause rank 1 (killed by signal 9"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("restarting the job with 2 ranks (restart 1 of 1)"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.summary["resumed_from"], checkpoint::StepDirectory(out + "/checkpoint", 10));
  EXPECT_EQ(r.summary["global_step"], 20);  // --max_steps: where the uninterrupted run ends
  EXPECT_EQ(r.summary["restarts"], 1);
  EXPECT_EQ(r.summary["steps_recomputed"], 1);  // step 11 ran, step 12's rank 1 died
  EXPECT_GT(r.summary["seconds_lost"].get<double>(), 0);
  EXPECT_NE(r.output.find("restarts 1, 1 steps recomputed"), std::string::npos) << r.output;
  const std::vector<double> straight = testing::FitLosses(base_);
  const std::vector<double> resumed = testing::FitLosses(out);
  ASSERT_EQ(resumed.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(resumed[i], straight[10 + i]) << "step " << 11 + i;
}

// NOTE [Data identity]: resuming the fit with another --seed (another language) is refused
// naming the field; with --resume_allow_data_change it resumes and says what differs.
TEST_F(MainJobTest, AResumeOnOtherDataIsRefusedUnlessAllowed) {
  std::vector<std::string> flags = {"--stages=fit", "--steps=2", "--release=false",
                                    "--resume_from=" + base_ + "/checkpoint", "--seed=5"};
  RunResult refused = MainJob(2, TempDir() + "/other_data", flags);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(refused.output,
                                "data.language_seed: the checkpoint's 1 vs this module's 6"))
      << refused.output;
  EXPECT_TRUE(absl::StrContains(refused.output, "--resume_allow_data_change")) << refused.output;
  flags.push_back("--resume_allow_data_change");
  RunResult allowed = MainJob(2, TempDir() + "/other_data_allowed", flags);
  ASSERT_EQ(allowed.exit_code, 0) << allowed.output;
  EXPECT_EQ(allowed.summary["global_step"], 42);
  EXPECT_EQ(allowed.summary["resumed_data_changes"],
            nlohmann::json::array({"data.language_seed: the checkpoint's 1 vs this module's 6"}));
  EXPECT_TRUE(absl::StrContains(allowed.output, "resuming on other data")) << allowed.output;
}

TEST_F(MainJobTest, SafetensorsRoundTripsFollowsTheFormatAndMatchesTheCheckpoint) {
  const std::string path = base_ + "/model.safetensors";
  EXPECT_EQ(fit_->summary["safetensors_path"], path);
  const std::string bytes = ReadFile(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  ASSERT_LE(8 + n, bytes.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "header padded to 8 bytes";
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  // Offsets tile the buffer in file order; F32 elements, shapes as the model's.
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    EXPECT_EQ(it.value()["dtype"], "F32") << it.key();
    int64_t numel = 1;
    for (const auto& d : it.value()["shape"]) numel *= d.get<int64_t>();
    const int64_t b = it.value()["data_offsets"][0], e = it.value()["data_offsets"][1];
    EXPECT_EQ(e - b, numel * 4) << it.key();
    ranges.push_back({b, e});
  }
  std::sort(ranges.begin(), ranges.end());
  int64_t at = 0;
  for (const auto& [b, e] : ranges) {
    EXPECT_EQ(b, at);
    at = e;
  }
  EXPECT_EQ(static_cast<uint64_t>(at), bytes.size() - 8 - n);

  absl::StatusOr<checkpoint::SafetensorsFile> file = checkpoint::ImportSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_NE(file->Find("wte.weight"), nullptr);
  EXPECT_NE(file->Find("blocks.1.mlp.fc.weight"), nullptr);
  // The released weights are those the checkpoint holds (the same trained step).
  for (const auto& [name, tensor] : file->tensors) {
    absl::StatusOr<std::vector<std::pair<std::string, core::Tensor>>> saved =
        checkpoint::LoadFull(base_ + "/checkpoint", {"model/" + name});
    ASSERT_TRUE(saved.ok()) << saved.status();
    EXPECT_EQ((*saved)[0].second.shape(), tensor.shape()) << name;
    EXPECT_EQ((*saved)[0].second.ToVector(), tensor.ToVector()) << name;
  }
}

// Copies the fit's checkpoint and damages the data file holding a model tensor's bytes.
std::string DamagedCopy(const std::string& from, const std::string& to, bool truncate,
                        std::string* file_name) {
  std::filesystem::remove_all(to);
  std::filesystem::copy(from, to, std::filesystem::copy_options::recursive);
  absl::StatusOr<checkpoint::CheckpointInfo> info = checkpoint::ReadMetadata(to);
  EXPECT_TRUE(info.ok()) << info.status();
  // The last rank's file: it holds the second half of wte.weight's elements.
  *file_name = absl::StrCat("rank-00001-of-00002.bin");
  const std::string path = to + "/" + *file_name;
  if (truncate) {
    EXPECT_EQ(::truncate(path.c_str(), 0), 0);
  } else {
    std::string bytes = ReadFile(path);
    for (size_t i = 0; i < bytes.size(); i += 64) bytes[i] ^= 0x5a;  // every checksum block
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }
  return to;
}

TEST_F(MainJobTest, CorruptedOrTruncatedCheckpointIsRefusedNamingFileAndTensor) {
  for (bool truncate : {false, true}) {
    std::string file;
    const std::string dir =
        DamagedCopy(base_ + "/checkpoint", TempDir() + (truncate ? "/truncated" : "/corrupted"),
                    truncate, &file);
    RunResult r = MainJob(2, TempDir() + "/damaged",
                          {"--stages=test", "--resume_from=" + dir, "--release=false"});
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("DATA_LOSS"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(file), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("model/"), std::string::npos) << "names the tensor: " << r.output;
    // The launcher names the rank that read the damaged file as the root cause.
    EXPECT_NE(r.output.find("launch: root cause: rank 1 at "), std::string::npos) << r.output;
  }
}

// --help lists the job's flags (defined in trainer/internal/job_options.cc), not only
// absl's pointer to --helpfull.
TEST(MainJobHelpTest, ListsTheJobsFlags) {
  RunResult r = RunCommand({Runfile("trainer/main_job"), "--help"}, absl::Seconds(60));
  for (const char* flag : {"--device", "--backend", "--strategy", "--world_size", "--steps"}) {
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag << " in:\n" << r.output;
  }
}

// --device=cuda is refused up front, naming the reason, where it cannot run: a build
// without CUDA (how to build it) or no usable GPU; --device=cpu --backend=nccl too.
TEST(MainJobDeviceTest, RefusesCudaWhereItCannotRunAndNcclOnTheCpu) {
  RunResult cuda = MainJob(1, TempDir() + "/cuda", {"--device=cuda", "--steps=2"});
  if (cuda.exit_code == 0) {
    EXPECT_EQ(cuda.summary["device"], "cuda") << cuda.output;  // a CUDA build on a GPU
  } else {
    EXPECT_TRUE(cuda.output.find("--config=cuda") != std::string::npos ||
                cuda.output.find("no usable GPU") != std::string::npos)
        << cuda.output;
  }
  RunResult nccl = MainJob(1, TempDir() + "/nccl", {"--backend=nccl", "--steps=2"});
  EXPECT_NE(nccl.exit_code, 0);
  EXPECT_NE(nccl.output.find("--device=cpu --backend=nccl"), std::string::npos) << nccl.output;
}

// Token files (--data): test evaluates every window of the evaluation file once, the same
// bits at N = 1, 2 and 4 under --deterministic; the checkpoint records where in the epochs
// the fit stopped, and the resume line says so.
TEST(MainJobTokenFilesTest, TestCoversTheWholeFileAtEveryWorldSizeAndResumesNameThePosition) {
  // 37 windows of 16 + 1 tokens below 32 (SmallModelFlags' vocabulary), nanoGPT layout.
  const std::string data = TempDir() + "/tokens.bin";
  {
    std::ofstream out(data, std::ios::binary | std::ios::trunc);
    uint32_t x = 12345u;
    for (int i = 0; i < 37 * 16 + 1; ++i) {
      x = x * 1664525u + 1013904223u;
      const uint16_t t = static_cast<uint16_t>((x >> 16) % 32);
      out.write(reinterpret_cast<const char*>(&t), 2);
    }
  }
  const std::vector<std::string> flags = {"--data=" + data, "--deterministic",
                                          "--deterministic_micro_batches=4", "--release=false"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), flags.begin(), flags.end());
    return extra;
  };
  const std::string fit_dir = TempDir() + "/tokens_fit";
  RunResult fit = MainJob(2, fit_dir, with({"--stages=fit,test", "--steps=6"}));
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  // 37 x 16 target tokens in ceil(37 / 8) batches, --eval_batches=4 notwithstanding.
  EXPECT_TRUE(
      absl::StrContains(fit.output, "over 592 tokens (the whole evaluation set: 5 batches)"))
      << fit.output;
  for (int n : {1, 4}) {
    RunResult r = MainJob(n, absl::StrCat(TempDir(), "/tokens_test", n),
                          with({"--stages=test", "--resume_from=" + fit_dir + "/checkpoint"}));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // 6 steps of 8 rows: the next sample is 48, window 11 of epoch 1.
    EXPECT_TRUE(absl::StrContains(r.output, "data epoch 1 window 11")) << r.output;
    EXPECT_EQ(r.summary["resumed_data_position"]["data.epoch"], "1");
    EXPECT_EQ(Num(r.summary, "test_loss"), Num(fit.summary, "test_loss")) << "N = " << n;
  }
}

}  // namespace
}  // namespace integration
