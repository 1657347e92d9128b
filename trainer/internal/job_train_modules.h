// The main job's TrainModule wrappers (trainer/main_job.cc): each passes every call to
// the module it wraps (ForwardingTrainModule) and changes one.
//
//   integration::ThroughputMeter meter(steps);
//   integration::internal::TimedTrainModule timed(&gpt_module, &meter);
//   runner->Fit(timed);  // the meter saw every step start; progress lines say tokens/s
#ifndef TRAINER_INTERNAL_JOB_TRAIN_MODULES_H_
#define TRAINER_INTERNAL_JOB_TRAIN_MODULES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "integration/device_setup.h"
#include "integration/forwarding_train_module.h"
#include "integration/train_module.h"

namespace integration {
namespace internal {

// The --testonly_fault hook: misbehaves at chosen training steps on chosen ranks, for the
// fault-injection and chaos tests.
class FaultInjector : public ForwardingTrainModule {
 public:
  // `spec` is a comma-separated list of faults <action>@<rank>:<step>[:<restart>]. <step> >= 1
  // counts this process's TrainingStep calls, or, written g<N>, is global step N (the fault
  // fires at that step's first TrainingStep). A fault applies at the start whose restart count
  // (RestartCount(), NOTE [Restarts] in comm/launcher.h) is <restart>, 0 by default, and on rank
  // <rank> of that start. Actions:
  //   kill, stop, exit, error   SIGKILL, SIGSTOP, exit with code 3, or fail the step (Internal);
  //   lose                      append the rank to $FSDP_LOST_RANKS_FILE (the launcher restarts
  //                             without its slot) and SIGKILL;
  //   diskfull                  this rank's write of the periodic checkpoint of global step
  //                             <step> (g<N> or N alike) fails with "No space left on device"
  //                             (WriteErrorHook).
  // InvalidArgument naming --testonly_fault for a malformed spec.
  static absl::StatusOr<std::unique_ptr<FaultInjector>> Parse(const std::string& spec, int rank,
                                                              TrainModule* inner, int restart = 0);

  absl::StatusOr<StepOutput> TrainingStep(const StepContext& ctx) override;
  // StageOptions::testonly_write_error for the diskfull faults of this rank and start; null
  // when there are none.
  std::function<absl::Status(int64_t step)> WriteErrorHook() const;

 private:
  struct Fault {
    std::string action;
    int64_t step = 0;
    bool global = false;  // step is a global step (g<N>)
  };
  FaultInjector(TrainModule* inner, std::vector<Fault> faults)
      : ForwardingTrainModule(inner), faults_(std::move(faults)) {}

  std::vector<Fault> faults_;  // this rank's, at this start
  int64_t steps_ = 0;
  int64_t last_global_step_ = -1;
};

// Tells `meter` (not owned) when each training step starts.
class TimedTrainModule : public ForwardingTrainModule {
 public:
  TimedTrainModule(TrainModule* inner, ThroughputMeter* meter)
      : ForwardingTrainModule(inner), meter_(meter) {}

  // Counts a step start at the first TrainingStep of each optimizer step (ctx.step), not
  // at every micro-batch.
  absl::StatusOr<StepOutput> TrainingStep(const StepContext& ctx) override;

 private:
  ThroughputMeter* meter_;
  int64_t last_step_ = -1;
};

}  // namespace internal
}  // namespace integration

#endif  // TRAINER_INTERNAL_JOB_TRAIN_MODULES_H_
