#include "trainer/testing/e2e_harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "checkpoint/safetensors.h"

namespace integration {
namespace testing {

std::string Runfile(const std::string& path) {
  // The runfiles tree has one directory per repository. This repository's is the main
  // workspace's (TEST_WORKSPACE) when its own tests run, and another one when a
  // workspace that depends on it runs them: try the main one, then each, so no
  // repository name is assumed.
  const char* srcdir_env = std::getenv("TEST_SRCDIR");
  const std::string srcdir = srcdir_env ? srcdir_env : ".";
  const char* workspace = std::getenv("TEST_WORKSPACE");
  const std::string main = absl::StrCat(srcdir, "/", workspace ? workspace : "", "/", path);
  if (::access(main.c_str(), F_OK) == 0) return main;
  if (DIR* dir = ::opendir(srcdir.c_str())) {
    while (dirent* e = ::readdir(dir)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      const std::string candidate = absl::StrCat(srcdir, "/", name, "/", path);
      if (::access(candidate.c_str(), F_OK) == 0) {
        ::closedir(dir);
        return candidate;
      }
    }
    ::closedir(dir);
  }
  return main;
}

std::string TempDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> SmallModelFlags() {
  return {"--vocab_size=32",  "--block_size=16", "--seq_len=16",     "--n_embd=32",
          "--n_layer=2",      "--n_head=2",      "--batch_size=8",   "--eval_batch_size=8",
          "--eval_batches=4", "--log_every=10",  "--warmup_steps=5", "--lr=1e-2",
          "--timeout_s=60"};
}

RunResult RunCommand(std::vector<std::string> argv, absl::Duration timeout) {
  RunResult result;
  const std::string log =
      absl::StrCat(TempDir(), "/run-", ::getpid(), "-", absl::ToUnixNanos(absl::Now()), ".log");
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::unsetenv("RANK");
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(126);
  }
  int status = 0;
  const absl::Time deadline = absl::Now() + timeout;
  bool done = false;
  while (absl::Now() < deadline) {
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      done = true;
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (!done) {
    ::kill(pid, SIGTERM);  // the launcher forwards it to the ranks
    absl::SleepFor(absl::Seconds(6));
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    result.output = ReadFile(log) + "\n<killed: timeout>";
    return result;
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.output = ReadFile(log);
  std::vector<std::string> lines = absl::StrSplit(result.output, '\n', absl::SkipEmpty());
  if (!lines.empty()) {
    std::string last = lines.back();
    if (last.rfind("[rank ", 0) == 0) last = last.substr(last.find("] ") + 2);
    result.summary = nlohmann::json::parse(last, nullptr, /*allow_exceptions=*/false);
    if (result.summary.is_discarded()) result.summary = nullptr;
  }
  return result;
}

RunResult RunRetryingPortRace(const std::vector<std::string>& argv, absl::Duration timeout) {
  RunResult r = RunCommand(argv, timeout);
  if (r.exit_code != 0 && r.output.find("ddress already in use") != std::string::npos) {
    std::printf("retrying after a port race: %s\n", argv[0].c_str());
    r = RunCommand(argv, timeout);
  }
  return r;
}

RunResult MainJob(int world_size, const std::string& out, std::vector<std::string> extra,
                  absl::Duration timeout) {
  std::vector<std::string> argv = {Runfile("trainer/main_job"),
                                   absl::StrCat("--world_size=", world_size),
                                   absl::StrCat("--output_dir=", out)};
  for (const std::string& f : SmallModelFlags()) argv.push_back(f);
  for (const std::string& f : extra) argv.push_back(f);
  return RunRetryingPortRace(argv, timeout);
}

std::vector<double> FitLosses(const std::string& dir) {
  std::vector<double> out;
  const nlohmann::json summary =
      nlohmann::json::parse(ReadFile(dir + "/summary.json"), nullptr, /*allow_exceptions=*/false);
  if (!summary.is_object() || !summary.contains("fit_losses")) return out;
  for (const auto& v : summary["fit_losses"]) out.push_back(v.get<double>());
  return out;
}

absl::Status SameSafetensors(const std::string& a, const std::string& b) {
  absl::StatusOr<checkpoint::SafetensorsFile> x = checkpoint::ImportSafetensors(a);
  if (!x.ok()) return x.status();
  absl::StatusOr<checkpoint::SafetensorsFile> y = checkpoint::ImportSafetensors(b);
  if (!y.ok()) return y.status();
  if (x->tensors.size() != y->tensors.size()) {
    return absl::InternalError(
        absl::StrCat(a, " holds ", x->tensors.size(), " tensors, ", b, " ", y->tensors.size()));
  }
  for (size_t i = 0; i < x->tensors.size(); ++i) {
    const core::Tensor& s = x->tensors[i].second;
    const core::Tensor& t = y->tensors[i].second;
    if (x->tensors[i].first != y->tensors[i].first || s.nbytes() != t.nbytes() ||
        std::memcmp(s.raw_data(), t.raw_data(), s.nbytes()) != 0) {
      return absl::InternalError(absl::StrCat("tensor ", i, " (", x->tensors[i].first, " / ",
                                              y->tensors[i].first, ") differs between ", a, " and ",
                                              b));
    }
  }
  return absl::OkStatus();
}

std::vector<int> ProcessesMentioning(const std::string& marker) {
  std::vector<int> pids;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* e = ::readdir(proc)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid) || pid == ::getpid()) continue;
    std::string cmdline = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
    for (char& c : cmdline) {
      if (c == '\0') c = ' ';
    }
    if (cmdline.find(marker) == std::string::npos) continue;
    // A zombie has exited already; only its parent's wait is missing.
    const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
    const size_t paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z') continue;
    pids.push_back(pid);
  }
  ::closedir(proc);
  return pids;
}

}  // namespace testing
}  // namespace integration
