// Fault injection, end to end: the main job in real processes (2 local ranks through the
// launcher) meets a fault, and the test asserts what the user sees: the exit status, the
// launcher's "root cause" line naming the rank and what went wrong, secondary errors
// labelled as such, and that no process is left behind.
//
//   fault                               root cause the launcher reports
//   corrupted / truncated / deleted     the rank that read the file: DATA_LOSS naming the
//     checkpoint data file              file and the tensor (also when that rank is slow
//                                       to print: an injected delay)
//   rank killed (SIGKILL) mid-fit       that rank, killed by signal 9
//   rank stopped (SIGSTOP) mid-fit      that rank, named by the survivors' timeouts
//   rank exits silently mid-fit         that rank, exit code 3
//   rank fails a step with an error     that rank's error; the survivor's is secondary
//   --n_layer=0, a binary or directory  INVALID_ARGUMENT naming the option or the file
//     --stage_config, bad --timeout_s
//   disk full while saving (tmpfs)      the error names the file; no temporary left
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "integration/testing/e2e_harness.h"

namespace integration {
namespace {

using testing::MainJob;
using testing::ProcessesMentioning;
using testing::ReadFile;
using testing::RunResult;
using testing::TempDir;

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The launcher's root-cause line, or "".
std::string RootCauseLine(const std::string& output) {
  const size_t at = output.find("launch: root cause: ");
  if (at == std::string::npos) return "";
  return output.substr(at, output.find('\n', at) - at);
}

class FaultInjectionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    base_ = TempDir() + "/base";
    base_run_ = new RunResult(MainJob(2, base_, {"--stages=fit", "--steps=20", "--release=false"}));
  }
  static void TearDownTestSuite() { delete base_run_; }

  void SetUp() override { ASSERT_EQ(base_run_->exit_code, 0) << base_run_->output; }

  // A run whose output directory is unique to the test, checked for leftovers after.
  RunResult Run(const std::string& name, std::vector<std::string> extra,
                absl::Duration timeout = absl::Seconds(120)) {
    const std::string out = TempDir() + "/" + name;
    RunResult r = MainJob(2, out, std::move(extra), timeout);
    EXPECT_TRUE(ProcessesMentioning("--output_dir=" + out).empty())
        << "processes left behind by " << name;
    return r;
  }

  // A copy of the base checkpoint with rank 1's data file damaged by `how`.
  std::string Damaged(const std::string& how) {
    const std::string dir = TempDir() + "/damaged-" + how;
    std::filesystem::remove_all(dir);
    std::filesystem::copy(base_ + "/checkpoint", dir, std::filesystem::copy_options::recursive);
    const std::string path = dir + "/rank-00001-of-00002.bin";
    if (how == "truncated") {
      EXPECT_EQ(::truncate(path.c_str(), 16), 0);
    } else if (how == "deleted") {
      EXPECT_EQ(::unlink(path.c_str()), 0);
    } else {
      std::string bytes = ReadFile(path);
      for (size_t i = 0; i < bytes.size(); i += 64) bytes[i] ^= 0x5a;
      std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    }
    return dir;
  }

  static std::string base_;
  static RunResult* base_run_;
};
std::string FaultInjectionTest::base_;
RunResult* FaultInjectionTest::base_run_ = nullptr;

TEST_F(FaultInjectionTest, DamagedDataFileIsTheRootCauseOnEveryRank) {
  for (const std::string how : {"corrupted", "truncated", "deleted"}) {
    SCOPED_TRACE(how);
    const std::string dir = Damaged(how);
    RunResult r = Run("load-" + how, {"--stages=test", "--resume_from=" + dir, "--release=false"});
    EXPECT_EQ(r.exit_code, 1) << r.output;
    const std::string root = RootCauseLine(r.output);
    EXPECT_TRUE(absl::StartsWith(root, "launch: root cause: rank 1 at ")) << r.output;
    EXPECT_TRUE(Has(root, "rank-00001-of-00002.bin")) << root;
    EXPECT_TRUE(Has(root, "model/")) << "names the tensor: " << root;
    // Both ranks fail with the same error; rank 0's says it comes from rank 1.
    EXPECT_TRUE(Has(r.output, "launch: secondary: rank 0 at ")) << r.output;
    EXPECT_TRUE(Has(r.output, "secondary (caused by rank 1)")) << r.output;
    EXPECT_FALSE(Has(r.output, "peer closed")) << r.output;
  }
}

TEST_F(FaultInjectionTest, RootCauseWinsWhenTheFailingRankIsSlowToPrint) {
  const std::string dir = Damaged("corrupted");
  RunResult r = Run("slow-print", {"--stages=test", "--resume_from=" + dir, "--release=false",
                                   "--testonly_failure_print_delay_ms=3000"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const std::string root = RootCauseLine(r.output);
  EXPECT_TRUE(absl::StartsWith(root, "launch: root cause: rank 1 at ")) << r.output;
  EXPECT_TRUE(Has(root, "DATA_LOSS")) << root;
  EXPECT_TRUE(Has(root, "rank-00001-of-00002.bin")) << root;
}

TEST_F(FaultInjectionTest, KilledRankIsTheRootCause) {
  RunResult r = Run("kill", {"--stages=fit", "--steps=40", "--testonly_fault=kill@1:5"});
  EXPECT_EQ(r.exit_code, 128 + 9) << r.output;
  EXPECT_TRUE(Has(r.output, "job failed: root cause rank 1 (killed by signal 9")) << r.output;
}

TEST_F(FaultInjectionTest, StoppedRankIsNamedByTheSurvivorsTimeouts) {
  RunResult r = Run("stop", {"--stages=fit", "--steps=40", "--testonly_fault=stop@1:5",
                             "--timeout_s=3"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  const std::string root = RootCauseLine(r.output);
  EXPECT_TRUE(absl::StartsWith(root, "launch: root cause: rank 1, named by the other ranks' "
                                     "errors: it was stopped by signal 19"))
      << r.output;
  EXPECT_TRUE(Has(r.output, "launch: secondary: rank 0 at ")) << r.output;
  EXPECT_TRUE(Has(r.output, "job failed: root cause rank 1")) << r.output;
}

TEST_F(FaultInjectionTest, RankThatExitsSilentlyIsTheRootCause) {
  RunResult r = Run("exit", {"--stages=fit", "--steps=40", "--testonly_fault=exit@1:5"});
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(Has(r.output, "job failed: root cause rank 1 (exited with code 3)")) << r.output;
}

TEST_F(FaultInjectionTest, StepErrorIsTheRootCauseAndThePeerErrorIsSecondary) {
  RunResult r = Run("error", {"--stages=fit", "--steps=40", "--testonly_fault=error@1:5"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const std::string root = RootCauseLine(r.output);
  EXPECT_TRUE(absl::StartsWith(root, "launch: root cause: rank 1 at ")) << r.output;
  EXPECT_TRUE(Has(root, "INTERNAL")) << root;
  EXPECT_TRUE(Has(root, "injected error at step 5")) << root;
  EXPECT_FALSE(Has(r.output, "launch: also failed: rank 0")) << r.output;
}

TEST_F(FaultInjectionTest, BadConfigurationIsRefusedNamingTheOptionOrFile) {
  const std::string binary = TempDir() + "/binary.cfg";
  {
    std::ofstream out(binary, std::ios::binary);
    for (int i = 0; i < 256; ++i) out.put(static_cast<char>((i * 37 + 11) & 0xff));
  }
  struct Case {
    std::vector<std::string> flags;
    std::string expected;  // in the root-cause line
  };
  const std::vector<Case> cases = {
      {{"--n_layer=0"}, "n_layer"},
      {{"--stage_config=" + binary}, binary},
      {{"--stage_config=" + TempDir()}, TempDir()},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flags[0]);
    RunResult r = Run(absl::StrCat("config-", i++), c.flags);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    const std::string root = RootCauseLine(r.output);
    EXPECT_TRUE(Has(root, "INVALID_ARGUMENT")) << r.output;
    EXPECT_TRUE(Has(root, c.expected)) << root;
  }
  // Refused by the main job before any rank starts.
  for (const std::string t : {"inf", "nan", "-1", "1e10"}) {
    RunResult r = Run("timeout", {"--timeout_s=" + t});
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(Has(r.output, "--timeout_s")) << r.output;
    EXPECT_FALSE(Has(r.output, "starting 2 local ranks")) << r.output;
  }
}

TEST_F(FaultInjectionTest, DiskFullWhileSavingNamesTheFileAndLeavesNoTemporary) {
  // A 96 KiB tmpfs in a mount namespace of the job's own: the checkpoint (about 330 KB)
  // does not fit.
  const std::string mnt = TempDir() + "/small-disk";
  std::filesystem::create_directories(mnt);
  std::vector<std::string> job = {testing::Runfile("integration/main_job"), "--world_size=2",
                                  "--output_dir=" + mnt + "/out", "--stages=fit", "--steps=5",
                                  "--release=false"};
  for (const std::string& f : testing::SmallModelFlags()) job.push_back(f);
  std::string command = absl::StrCat("mount -t tmpfs -o size=96k tmpfs '", mnt, "' && exec");
  for (const std::string& a : job) absl::StrAppend(&command, " '", a, "'");
  RunResult r = testing::RunCommand({"unshare", "-m", "sh", "-c", command});
  ASSERT_FALSE(Has(r.output, "mount: ")) << "this test needs root for a tmpfs: " << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const std::string root = RootCauseLine(r.output);
  EXPECT_TRUE(Has(root, "No space left on device")) << r.output;
  EXPECT_TRUE(Has(root, mnt + "/out/checkpoint")) << root;
  EXPECT_TRUE(ProcessesMentioning("--output_dir=" + mnt + "/out").empty());
}

}  // namespace
}  // namespace integration
