// The device routing of an optimizer step, written once for every optimizer: each
// parameter's update (an AdamWSegment or SgdSegment, kernels/optim.h) runs at once on the
// CPU, through an FSDP_CPU_CLONES loop (kernels/cpu.h) over IntraOpThreads() threads, or
// is queued for its CUDA device, whose queued segments Finish() updates in one fused
// launch (kernels/cuda/fused.h).
//
//   kernels::OptimizerStep step("AdamW");
//   for (...) RETURN_IF_ERROR(step.Add(p.data.device(), name, segment));
//   RETURN_IF_ERROR(step.Finish());
#ifndef KERNELS_OPTIM_STEP_H_
#define KERNELS_OPTIM_STEP_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/device.h"
#include "core/op_profile.h"
#include "kernels/optim.h"

namespace kernels {

// Updates the n elements of a CPU segment on IntraOpThreads() threads, each element bit
// for bit as AdamWUpdate / SgdUpdate computes it alone, for any thread count.
void AdamWOnCpu(const AdamWSegment& seg);
void SgdOnCpu(const SgdSegment& seg);

// The updates of one optimizer step, routed by device. Not thread-safe.
class OptimizerStep {
 public:
  // `optimizer` names the optimizer in every error ("AdamW", "SGD").
  explicit OptimizerStep(std::string optimizer) : optimizer_(std::move(optimizer)) {}

  // Updates `seg`, which lives on `device`: a CPU segment before returning, a CUDA one at
  // Finish(). FailedPrecondition "<optimizer>: parameter '<param_name>' is on <device> but
  // this build has no CUDA support" for a CUDA device in a build without CUDA.
  absl::Status Add(core::Device device, absl::string_view param_name, const AdamWSegment& seg);
  absl::Status Add(core::Device device, absl::string_view param_name, const SgdSegment& seg);

  // Launches the queued CUDA segments, one fused launch per device (and kind) on its
  // compute stream; the launches are asynchronous. Errors name the optimizer and the
  // device. OK with nothing queued.
  absl::Status Finish();

 private:
  // Runs `seg` with on_cpu on the CPU, or queues it in `queued` for its CUDA device.
  template <typename Segment>
  absl::Status Route(core::Device device, absl::string_view param_name, const Segment& seg,
                     void (*on_cpu)(const Segment&), std::map<int, std::vector<Segment>>* queued);

  std::string optimizer_;
  std::map<int, std::vector<AdamWSegment>> adamw_;
  std::map<int, std::vector<SgdSegment>> sgd_;
  // What the CPU segments added since the last Finish cost (NOTE [Op accounting]);
  // launches 0 while there are none.
  core::OpCost cpu_cost_ = core::OpCost::Memory(0, 0, 0);
};

}  // namespace kernels

#endif  // KERNELS_OPTIM_STEP_H_
