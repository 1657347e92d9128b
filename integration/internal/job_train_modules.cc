#include "integration/internal/job_train_modules.h"

#include <signal.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace integration {
namespace internal {

absl::StatusOr<std::unique_ptr<FaultInjector>> FaultInjector::Parse(const std::string& spec,
                                                                    int rank, TrainModule* inner) {
  std::vector<std::string> parts = absl::StrSplit(spec, absl::ByAnyChar("@:"));
  int fault_rank = 0;
  int64_t step = 0;
  if (parts.size() != 3 ||
      (parts[0] != "kill" && parts[0] != "stop" && parts[0] != "exit" && parts[0] != "error") ||
      !absl::SimpleAtoi(parts[1], &fault_rank) || !absl::SimpleAtoi(parts[2], &step) || step < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--testonly_fault=", spec, ": expected <kill|stop|exit|error>@<rank>:<step>, step >= 1"));
  }
  return std::unique_ptr<FaultInjector>(
      new FaultInjector(inner, parts[0], fault_rank == rank ? step : -1));
}

absl::StatusOr<StepOutput> FaultInjector::TrainingStep(const StepContext& ctx) {
  if (++steps_ == fault_step_) {
    if (action_ == "kill") ::raise(SIGKILL);
    if (action_ == "stop") ::raise(SIGSTOP);
    if (action_ == "exit") ::_exit(3);
    return absl::InternalError(absl::StrCat("--testonly_fault: injected error at step ", steps_));
  }
  return ForwardingTrainModule::TrainingStep(ctx);
}

absl::StatusOr<StepOutput> TimedTrainModule::TrainingStep(const StepContext& ctx) {
  if (ctx.step != last_step_) {  // micro-batches of one step count once
    meter_->StepStarted(absl::Now());
    last_step_ = ctx.step;
  }
  return ForwardingTrainModule::TrainingStep(ctx);
}

}  // namespace internal
}  // namespace integration
