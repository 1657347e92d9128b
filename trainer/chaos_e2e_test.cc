// The chaos test (NOTE [Restarts] in comm/launcher.h, NOTE [Run log] in
// trainer/internal/run_log.h): a fit of 200 steps on 4 CPU ranks in the deterministic mode,
// with asynchronous checkpoints every 10 steps, meets a schedule of faults and ends with the
// losses and released weights, bit for bit, of the same run without faults.
//
//   launch A (4 ranks, --max_restarts=2)
//     start 0     SIGKILL of a random rank at a random step in [12, 45]
//     restart 1   SIGKILL of a random rank at the step after a save began (the save in flight)
//     restart 2   the disk fills while a random rank writes the checkpoint of step 100 or 110:
//                 the job fails; the previous checkpoint loads and no temporary is left
//   launch B (--resume_from=latest, --max_restarts=1, --min_world_size=2)
//     start 0     ranks 1 and 3 are lost for good (their slots marked, then SIGKILL) at a
//                 random step in [121, 160]
//     restart 1   continues at 2 ranks with the same global batch to step 200
//
// Each fault costs the steps since the newest committed checkpoint, printed per fault beside
// the checkpoint interval. The schedule's seed is printed; FSDP_CHAOS_SEED sets it.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "checkpoint/series.h"
#include "checkpoint/sharded.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "trainer/testing/e2e_harness.h"

namespace integration {
namespace {

using testing::MainJob;
using testing::ReadFile;
using testing::RunResult;
using testing::TempDir;

constexpr int kSteps = 200;
constexpr int kInterval = 10;

// The flags every run shares: the deterministic mode (8 micro-batches of 1 row: world sizes
// 1, 2, 4), one intra-op thread per rank (the bits depend on it), a progress line and a run-log
// entry every step, asynchronous checkpoints every kInterval steps, and fit to kSteps.
std::vector<std::string> Flags(std::vector<std::string> extra) {
  std::vector<std::string> flags = {"--stages=fit",
                                    "--backend=shm",
                                    "--deterministic",
                                    "--deterministic_micro_batches=8",
                                    "--intra_op_threads=1",
                                    "--log_every=1",
                                    absl::StrCat("--max_steps=", kSteps),
                                    absl::StrCat("--checkpoint_every_steps=", kInterval),
                                    "--async_checkpoints",
                                    "--keep_checkpoints=3",
                                    "--resume_from=latest"};
  for (std::string& f : extra) flags.push_back(std::move(f));
  return flags;
}

struct Start {
  int restart = 0;
  int world_size = 0;
  int64_t from_step = 0;
  int64_t reached = 0;
  int64_t recomputed = 0;
  int64_t last_step = 0;        // the last step this start logged
  int64_t last_committed = -1;  // the newest committed checkpoint it logged
};

struct RunLogContents {
  std::vector<Start> starts;
  std::map<int64_t, double> losses;  // the last logged loss of each step
};

RunLogContents ReadRunLog(const std::string& path) {
  RunLogContents out;
  std::istringstream in(ReadFile(path));
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json e = nlohmann::json::parse(line, nullptr, false);
    if (!e.is_object()) continue;
    if (e["event"] == "start") {
      Start s;
      s.restart = e["restart"];
      s.world_size = e["world_size"];
      s.from_step = e["from_step"];
      s.reached = e["reached"];
      s.recomputed = e["recomputed"];
      s.last_step = s.from_step;
      out.starts.push_back(s);
    } else if (e["event"] == "step" && !out.starts.empty()) {
      out.losses[e["step"].get<int64_t>()] = e["loss"].get<double>();
      out.starts.back().last_step = e["step"];
      out.starts.back().last_committed = e["committed"];
    }
  }
  return out;
}

// The entries of `dir` that are not step checkpoints ("step-<9 digits>").
std::vector<std::string> NotStepCheckpoints(const std::string& dir) {
  std::vector<std::string> odd;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    int64_t step = 0;
    if (!(absl::StartsWith(name, "step-") && name.size() == 14 &&
          absl::SimpleAtoi(name.substr(5), &step) && entry.is_directory())) {
      odd.push_back(name);
    }
  }
  return odd;
}

TEST(ChaosTest, FaultsRestartsAndAShrinkEndOnTheUninterruptedBits) {
  uint64_t seed = std::random_device{}();
  if (const char* s = std::getenv("FSDP_CHAOS_SEED")) {
    ASSERT_TRUE(absl::SimpleAtoi(s, &seed)) << "FSDP_CHAOS_SEED=" << s;
  }
  std::mt19937_64 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int kill_rank = pick(0, 3), kill_step = pick(12, 45);
  const int save_kill_rank = pick(0, 3), save_kill_step = kInterval * pick(6, 7) + 1;
  const int full_rank = pick(0, 3), full_step = kInterval * pick(10, 11);
  const int lose_step = pick(121, 160);
  const std::string faults_a =
      absl::StrCat("kill@", kill_rank, ":g", kill_step, ",kill@", save_kill_rank, ":g",
                   save_kill_step, ":1,diskfull@", full_rank, ":g", full_step, ":2");
  const std::string faults_b = absl::StrCat("lose@1:g", lose_step, ",lose@3:g", lose_step);
  std::printf(
      "chaos seed %llu (FSDP_CHAOS_SEED): launch A --testonly_fault=%s; launch B "
      "--testonly_fault=%s\n",
      static_cast<unsigned long long>(seed), faults_a.c_str(), faults_b.c_str());

  const absl::Duration deadline = absl::Seconds(600);
  const std::string straight = TempDir() + "/chaos_straight";
  RunResult reference = MainJob(4, straight, Flags({}), deadline);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;

  const std::string out = TempDir() + "/chaos";
  const std::string checkpoints = out + "/checkpoint";
  RunResult a =
      MainJob(4, out, Flags({"--max_restarts=2", "--testonly_fault=" + faults_a}), deadline);
  // The disk filled at the last start allowed: the job fails, naming it.
  ASSERT_NE(a.exit_code, 0) << a.output;
  EXPECT_TRUE(absl::StrContains(a.output, "No space left on device")) << a.output;
  EXPECT_TRUE(absl::StrContains(a.output, checkpoint::StepDirectory(checkpoints, full_step)))
      << a.output;
  // Nothing but committed step checkpoints is left, and the newest one verifies.
  EXPECT_TRUE(NotStepCheckpoints(checkpoints).empty())
      << "left beside the checkpoints: " << absl::StrJoin(NotStepCheckpoints(checkpoints), ", ");
  std::vector<std::string> steps;
  for (const auto& entry : std::filesystem::directory_iterator(checkpoints)) {
    steps.push_back(entry.path().string());
  }
  std::sort(steps.begin(), steps.end());
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.back(), checkpoint::StepDirectory(checkpoints, full_step - kInterval));
  EXPECT_TRUE(checkpoint::VerifyCheckpoint(steps.back()).ok()) << steps.back();

  RunResult b = MainJob(
      4, out, Flags({"--max_restarts=1", "--min_world_size=2", "--testonly_fault=" + faults_b}),
      deadline);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(b.summary["world_size"], 2) << "the last start ran at 2 ranks";
  EXPECT_EQ(b.summary["global_step"], kSteps);

  // Bit for bit: every step's loss and the released weights.
  const RunLogContents want = ReadRunLog(straight + "/run_log.jsonl");
  const RunLogContents got = ReadRunLog(out + "/run_log.jsonl");
  ASSERT_EQ(want.losses.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(got.losses.size(), static_cast<size_t>(kSteps));
  for (const auto& [step, loss] : want.losses) {
    const double other = got.losses.at(step);
    ASSERT_EQ(std::memcmp(&loss, &other, sizeof(double)), 0)
        << "step " << step << ": " << loss << " vs " << other;
  }
  EXPECT_TRUE(
      testing::SameSafetensors(straight + "/model.safetensors", out + "/model.safetensors").ok());

  // Five starts after the first: what each fault cost.
  const char* what[] = {"SIGKILL of a random rank", "SIGKILL during an asynchronous save",
                        "disk full during a save", "two ranks lost for good"};
  ASSERT_EQ(got.starts.size(), 5u) << ReadFile(out + "/run_log.jsonl");
  for (size_t i = 1; i < got.starts.size(); ++i) {
    const Start& before = got.starts[i - 1];
    const Start& s = got.starts[i];
    const int64_t lost = s.reached - s.from_step;
    std::printf(
        "fault %zu (%s): reached step %lld, newest committed checkpoint step %lld, "
        "resumed from step %lld at %d ranks: %lld steps lost (checkpoint interval %d)\n",
        i, what[i - 1], static_cast<long long>(s.reached),
        static_cast<long long>(before.last_committed), static_cast<long long>(s.from_step),
        s.world_size, static_cast<long long>(lost), kInterval);
    EXPECT_EQ(s.reached, before.last_step) << "fault " << i;
    EXPECT_EQ(s.recomputed, lost) << "fault " << i;
    // The restart resumes from the newest checkpoint committed before the fault (or one
    // committed after the last report): the work lost is the steps since then.
    EXPECT_GE(s.from_step, before.last_committed) << "fault " << i;
    EXPECT_EQ(s.from_step % kInterval, 0) << "fault " << i;
    EXPECT_LE(s.from_step, s.reached) << "fault " << i;
  }
  EXPECT_EQ(got.starts[1].restart, 1);
  EXPECT_EQ(got.starts[2].restart, 2);
  EXPECT_EQ(got.starts[3].restart, 0);  // launch B's first start
  EXPECT_EQ(got.starts[3].world_size, 4);
  EXPECT_EQ(got.starts[4].world_size, 2);
  // The save in flight at the second fault was not committed: that start lost a whole
  // interval; the disk-full start resumed from the checkpoint before the failed one.
  EXPECT_EQ(got.starts[2].from_step, save_kill_step - 1 - kInterval);
  EXPECT_EQ(got.starts[3].from_step, full_step - kInterval);
  EXPECT_EQ(b.summary["restarts"], 3);
}

}  // namespace
}  // namespace integration
