#include "comm/work.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace comm {

std::shared_ptr<CompletionWork> CompletionWork::Done(absl::Status status, std::string description) {
  auto work = std::make_shared<CompletionWork>(std::move(description));
  work->Complete(std::move(status));
  return work;
}

void CompletionWork::Complete(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (done_) return;
  done_ = true;
  status_ = std::move(status);
}

void CompletionWork::SetRunTime(absl::Duration run_time) {
  absl::MutexLock lock(&mu_);
  run_time_ = run_time;
}

std::optional<absl::Duration> CompletionWork::RunTime() const {
  absl::MutexLock lock(&mu_);
  if (!done_) return std::nullopt;
  return run_time_;
}

bool CompletionWork::IsCompleted() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

void CompletionWork::SetTimeoutDiagnosis(
    std::function<absl::Status(const std::string& what)> diagnose) {
  absl::MutexLock lock(&mu_);
  diagnose_ = std::move(diagnose);
}

absl::Status CompletionWork::Wait(absl::Duration timeout) {
  std::function<absl::Status(const std::string&)> diagnose;
  {
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&done_), timeout)) return status_;
    diagnose = diagnose_;
  }
  const std::string what =
      absl::StrCat("Wait(", absl::FormatDuration(timeout), ") on ", description_);
  if (diagnose) return diagnose(what);
  return absl::DeadlineExceededError(absl::StrCat(what, ": still running when the wait ended"));
}

}  // namespace comm
