#include "trainer/internal/job_train_modules.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "comm/launcher.h"

namespace integration {
namespace internal {

absl::StatusOr<std::unique_ptr<FaultInjector>> FaultInjector::Parse(const std::string& spec,
                                                                    int rank, TrainModule* inner,
                                                                    int restart) {
  std::vector<Fault> mine;
  for (absl::string_view one : absl::StrSplit(spec, ',')) {
    std::vector<std::string> parts = absl::StrSplit(one, absl::ByAnyChar("@:"));
    Fault fault;
    int fault_rank = 0;
    int fault_restart = 0;
    absl::string_view step = parts.size() >= 3 ? absl::string_view(parts[2]) : "";
    fault.global = absl::ConsumePrefix(&step, "g");
    if (parts.size() < 3 || parts.size() > 4 ||
        (parts[0] != "kill" && parts[0] != "stop" && parts[0] != "exit" && parts[0] != "error" &&
         parts[0] != "lose" && parts[0] != "diskfull") ||
        !absl::SimpleAtoi(parts[1], &fault_rank) || !absl::SimpleAtoi(step, &fault.step) ||
        fault.step < 1 ||
        (parts.size() == 4 && (!absl::SimpleAtoi(parts[3], &fault_restart) || fault_restart < 0))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--testonly_fault=", spec, ": '", one,
          "': expected <kill|stop|exit|error|lose|diskfull>@<rank>:<step>[:<restart>] (step "
          ">= 1, or g<N> for global step N), comma-separated"));
    }
    fault.action = parts[0];
    if (fault_rank == rank && fault_restart == restart) mine.push_back(fault);
  }
  return std::unique_ptr<FaultInjector>(new FaultInjector(inner, std::move(mine)));
}

absl::StatusOr<StepOutput> FaultInjector::TrainingStep(const StepContext& ctx) {
  ++steps_;
  const bool step_start = ctx.step != last_global_step_;  // micro-batches of one step: once
  last_global_step_ = ctx.step;
  for (const Fault& fault : faults_) {
    if (fault.action == "diskfull") continue;
    if (fault.global ? !(step_start && ctx.step + 1 == fault.step) : steps_ != fault.step) continue;
    if (fault.action == "kill") ::raise(SIGKILL);
    if (fault.action == "stop") ::raise(SIGSTOP);
    if (fault.action == "exit") ::_exit(3);
    if (fault.action == "lose") {
      // The launcher's file of slots lost for good (comm/launcher.h); the rank is the one it
      // was started as.
      if (const char* path = std::getenv(comm::kLostRanksFileEnv)) {
        if (std::FILE* f = std::fopen(path, "a")) {
          std::fprintf(f, "%s\n", std::getenv("RANK") != nullptr ? std::getenv("RANK") : "0");
          std::fclose(f);
        }
      }
      ::raise(SIGKILL);
    }
    return absl::InternalError(absl::StrCat("--testonly_fault: injected error at step ", steps_));
  }
  return ForwardingTrainModule::TrainingStep(ctx);
}

std::function<absl::Status(int64_t step)> FaultInjector::WriteErrorHook() const {
  std::vector<int64_t> steps;
  for (const Fault& fault : faults_) {
    if (fault.action == "diskfull") steps.push_back(fault.step);
  }
  if (steps.empty()) return nullptr;
  return [steps](int64_t step) {
    for (int64_t s : steps) {
      if (s == step) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "--testonly_fault: No space left on device writing the checkpoint of step ", step));
      }
    }
    return absl::OkStatus();
  };
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
