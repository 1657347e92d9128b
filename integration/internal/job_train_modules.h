// The main job's TrainModule wrappers (integration/main_job.cc): each passes every call to
// the module it wraps (ForwardingTrainModule) and changes one.
//
//   integration::ThroughputMeter meter(steps);
//   integration::internal::TimedTrainModule timed(&gpt_module, &meter);
//   runner->Fit(timed);  // the meter saw every step start; progress lines say tokens/s
#ifndef INTEGRATION_INTERNAL_JOB_TRAIN_MODULES_H_
#define INTEGRATION_INTERNAL_JOB_TRAIN_MODULES_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "integration/device_setup.h"
#include "integration/forwarding_train_module.h"
#include "integration/train_module.h"

namespace integration {
namespace internal {

// The --testonly_fault hook: misbehaves at one training step on one rank, for the
// fault-injection tests.
class FaultInjector : public ForwardingTrainModule {
 public:
  // `spec` is <kill|stop|exit|error>@<rank>:<step>, step >= 1 (counted in this process's
  // TrainingStep calls): at that step the rank SIGKILLs itself, SIGSTOPs itself, exits
  // with code 3, or returns Internal. On other ranks it only forwards. InvalidArgument
  // naming --testonly_fault for a malformed spec.
  static absl::StatusOr<std::unique_ptr<FaultInjector>> Parse(const std::string& spec, int rank,
                                                              TrainModule* inner);

  absl::StatusOr<StepOutput> TrainingStep(const StepContext& ctx) override;

 private:
  FaultInjector(TrainModule* inner, std::string action, int64_t fault_step)
      : ForwardingTrainModule(inner), action_(std::move(action)), fault_step_(fault_step) {}

  std::string action_;
  int64_t fault_step_;  // -1: not on this rank
  int64_t steps_ = 0;
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

#endif  // INTEGRATION_INTERNAL_JOB_TRAIN_MODULES_H_
