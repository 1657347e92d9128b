// Test-only helpers of the end-to-end tests: run the main job (or any command) in real
// processes with a deadline, capture what it prints, parse its last JSON line, and find
// processes a run left behind.
//
//   integration::testing::RunResult r = integration::testing::MainJob(
//       2, integration::testing::TempDir() + "/fit", {"--stages=fit", "--steps=20"});
//   EXPECT_EQ(r.exit_code, 0) << r.output;
//   EXPECT_EQ(r.summary["world_size"], 2);
//   EXPECT_TRUE(integration::testing::ProcessesMentioning(out_dir).empty());
#ifndef TRAINER_TESTING_E2E_HARNESS_H_
#define TRAINER_TESTING_E2E_HARNESS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace integration {
namespace testing {

struct RunResult {
  int exit_code = -1;      // 128 + signal when killed; -1 when it timed out
  std::string output;      // stdout and stderr together
  nlohmann::json summary;  // the last line, parsed (null when it is not JSON)
};

// `path` (relative to this repository's root) in the test's runfiles, whatever the
// repository is called (its own workspace, or @<name> in a workspace depending on it).
std::string Runfile(const std::string& path);
// $TEST_TMPDIR, or /tmp.
std::string TempDir();
std::string ReadFile(const std::string& path);

// The flags of a small, fast main-job model: 2 blocks of width 32, 8-row batches
// (divisible by 1, 2 and 4), 60 s collective deadlines.
std::vector<std::string> SmallModelFlags();

// Runs `argv` (RANK unset, so the main job starts its own ranks) with a deadline; past
// it the process gets SIGTERM, then SIGKILL, and the output ends "<killed: timeout>".
// The last output line that holds a JSON object is parsed (a "[rank 0] " prefix, as
// //comm:launch writes it, is skipped).
RunResult RunCommand(std::vector<std::string> argv, absl::Duration timeout = absl::Seconds(240));

// RunCommand, repeated once when rank 0's store lost its port to another process (the
// launcher picks a free port, and another process may take it before rank 0 binds it).
RunResult RunRetryingPortRace(const std::vector<std::string>& argv,
                              absl::Duration timeout = absl::Seconds(240));

// The main job at `world_size` local ranks writing into `out`, with SmallModelFlags()
// and then `extra`.
RunResult MainJob(int world_size, const std::string& out, std::vector<std::string> extra,
                  absl::Duration timeout = absl::Seconds(240));

// The fit losses a run wrote into `dir`/summary.json ("fit_losses"); empty when there are
// none.
std::vector<double> FitLosses(const std::string& dir);

// OK when the two safetensors files hold the same tensors, in the same order, byte for
// byte; otherwise an error naming the first that differs (or why a file did not read).
absl::Status SameSafetensors(const std::string& a, const std::string& b);

// Pids of live processes (zombies excluded) whose command line contains `marker`.
std::vector<int> ProcessesMentioning(const std::string& marker);

}  // namespace testing
}  // namespace integration

#endif  // TRAINER_TESTING_E2E_HARNESS_H_
