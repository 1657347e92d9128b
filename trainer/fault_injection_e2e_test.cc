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
//   a run too big for this host         RESOURCE_EXHAUSTED naming the estimate and the
//                                       shortfall, before training
//   disk full while saving (tmpfs)      the error names the file; no temporary left
//   hostile clients of rank 0's store   none: the job finishes with the undisturbed run's
//     (connect/close storms, idle          losses, and rank 0's memory stays within 64 MiB
//     connections announcing huge          of rank 1's (both printed)
//     frames, random bytes, no secret)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "trainer/testing/e2e_harness.h"

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
  RunResult r =
      Run("stop", {"--stages=fit", "--steps=40", "--testonly_fault=stop@1:5", "--timeout_s=3"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  const std::string root = RootCauseLine(r.output);
  EXPECT_TRUE(absl::StartsWith(root,
                               "launch: root cause: rank 1, named by the other ranks' "
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
    std::string code;      // in the root-cause line
    std::string expected;  // in the root-cause line too
  };
  const std::vector<Case> cases = {
      {{"--n_layer=0"}, "INVALID_ARGUMENT", "n_layer"},
      {{"--stage_config=" + binary}, "INVALID_ARGUMENT", binary},
      {{"--stage_config=" + TempDir()}, "INVALID_ARGUMENT", TempDir()},
      // About 270 GB of activations per host: refused before training, naming the shortfall.
      {{"--n_embd=512", "--block_size=4096", "--seq_len=4096", "--batch_size=512"},
       "RESOURCE_EXHAUSTED",
       "short by"},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flags[0]);
    RunResult r = Run(absl::StrCat("config-", i++), c.flags);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    const std::string root = RootCauseLine(r.output);
    EXPECT_TRUE(Has(root, c.code)) << r.output;
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
  std::vector<std::string> job = {testing::Runfile("trainer/main_job"),
                                  "--world_size=2",
                                  "--output_dir=" + mnt + "/out",
                                  "--stages=fit",
                                  "--steps=5",
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

// A free TCP port on 127.0.0.1 (bound, then released).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t n = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  ::close(fd);
  return ntohs(a.sin_port);
}

int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The resident memory in bytes of the process with RANK=<rank> in its environment and
// `marker` on its command line, or -1.
int64_t RankRss(const std::string& marker, int rank) {
  for (int pid : ProcessesMentioning(marker)) {
    std::string env = ReadFile(absl::StrCat("/proc/", pid, "/environ"));
    for (char& c : env) {
      if (c == '\0') c = '\n';
    }
    if (("\n" + env).find(absl::StrCat("\nRANK=", rank, "\n")) == std::string::npos) continue;
    for (absl::string_view line :
         absl::StrSplit(ReadFile(absl::StrCat("/proc/", pid, "/status")), '\n')) {
      if (!absl::ConsumePrefix(&line, "VmRSS:")) continue;
      int64_t kib = 0;
      if (absl::SimpleAtoi(
              absl::StripAsciiWhitespace(absl::StripSuffix(absl::StripAsciiWhitespace(line), "kB")),
              &kib)) {
        return kib * 1024;
      }
    }
  }
  return -1;
}

TEST_F(FaultInjectionTest, HostileStoreClientsDoNotDisturbTheJob) {
  const int port = FreePort();
  const std::string out = TempDir() + "/hostile";
  std::vector<std::string> argv = {testing::Runfile("comm/launch"),
                                   "--nproc=2",
                                   absl::StrCat("--master_port=", port),
                                   "--",
                                   testing::Runfile("trainer/main_job"),
                                   "--output_dir=" + out,
                                   "--stages=fit,test",
                                   "--steps=20",
                                   "--release=false"};
  for (const std::string& f : testing::SmallModelFlags()) argv.push_back(f);
  // A longer test stage, for a longer attack: the attack must outlast 100 connect/close
  // cycles even when the job runs fast and the attacker shares the CPU with a busy machine.
  argv.push_back("--eval_batches=2000");
  std::atomic<bool> done{false};
  std::atomic<int64_t> cycles{0}, idle{0}, garbage{0}, max_rss0{0}, max_rss1{0};
  std::thread attacker([&] {
    std::mt19937 rng(7);
    std::vector<int> held;
    while (!done.load()) {
      max_rss0 = std::max<int64_t>(max_rss0, RankRss("--output_dir=" + out, 0));
      max_rss1 = std::max<int64_t>(max_rss1, RankRss("--output_dir=" + out, 1));
      // Idle connections announcing a huge frame, held until the job ends.
      while (held.size() < 200) {
        const int fd = Connect(port);
        if (fd < 0) break;
        const unsigned char huge[8] = {0xff, 0xff, 0xff, 0x03, 0, 0, 0, 0};
        (void)!::write(fd, huge, sizeof(huge));
        held.push_back(fd);
        ++idle;
      }
      // Random bytes from clients that know no secret.
      for (int i = 0; i < 5; ++i) {
        const int fd = Connect(port);
        if (fd < 0) break;
        std::string bytes(200, '\0');
        for (char& c : bytes) c = static_cast<char>(rng());
        (void)!::write(fd, bytes.data(), bytes.size());
        ::close(fd);
        ++garbage;
      }
      // Connect/close storm.
      for (int i = 0; i < 200; ++i) {
        const int fd = Connect(port);
        if (fd < 0) {
          absl::SleepFor(absl::Milliseconds(5));
          break;
        }
        ::close(fd);
        ++cycles;
      }
    }
    for (int fd : held) ::close(fd);
  });
  RunResult r = testing::RunCommand(argv);
  done = true;
  attacker.join();
  std::printf(
      "hostile store clients: %lld connect/close cycles, %lld idle connections announcing "
      "64 MiB frames, %lld random-byte clients; peak RSS rank 0 (serves the store) %.1f MiB, "
      "rank 1 %.1f MiB\n",
      static_cast<long long>(cycles.load()), static_cast<long long>(idle.load()),
      static_cast<long long>(garbage.load()), max_rss0.load() / 1048576.0,
      max_rss1.load() / 1048576.0);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GT(cycles.load(), 100);  // the attack ran during the job (the count depends on its speed)
  EXPECT_EQ(idle.load(), 200);
  EXPECT_GT(garbage.load(), 0);
  // The attack did not change the numbers.
  nlohmann::json base = nlohmann::json::parse(ReadFile(base_ + "/summary.json"));
  EXPECT_EQ(r.summary["final_train_loss"], base["final_train_loss"]) << r.output;
  if (max_rss0.load() > 0 && max_rss1.load() > 0) {
    EXPECT_LT(max_rss0.load() - max_rss1.load(), int64_t{64} << 20);
  }
  EXPECT_TRUE(ProcessesMentioning("--output_dir=" + out).empty());
}

}  // namespace
}  // namespace integration
