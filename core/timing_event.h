// Timing events on a device's compute stream (NOTE [Compute stream] in core/cuda_status.h):
// what the op profile (core/op_profile.h) and the main job's device-timed throughput measure
// with. Any build compiles it; only a CUDA device in a --config=cuda build records events.
//
//   ASSIGN_OR_RETURN(void* start, core::RecordTimingEvent(device, "step 3"));
//   ... queue the step's work ...
//   ASSIGN_OR_RETURN(void* end, core::RecordTimingEvent(device, "step 3"));
//   ASSIGN_OR_RETURN(double ms, core::TimingEventMs(start, end, "step 3"));  // waits for end
//   core::DestroyTimingEvent(start);
//   core::DestroyTimingEvent(end);
#ifndef CORE_TIMING_EVENT_H_
#define CORE_TIMING_EVENT_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/device.h"

namespace core {

// A CUDA event (an opaque cudaEvent_t) recorded on `device`'s compute stream after the work
// queued there so far, to be destroyed with DestroyTimingEvent; nullptr for a CPU device
// (there is nothing to time). Unavailable for a CUDA device in a build without CUDA; a CUDA
// runtime error names `what`.
absl::StatusOr<void*> RecordTimingEvent(Device device, absl::string_view what);

// Destroys an event RecordTimingEvent made; nullptr does nothing.
void DestroyTimingEvent(void* event);

// Waits for `end` and returns the device milliseconds from `start` to `end` (two events of
// RecordTimingEvent on one device, `start` recorded first). InvalidArgument for a null
// event; a CUDA runtime error names `what`.
absl::StatusOr<double> TimingEventMs(void* start, void* end, absl::string_view what);

}  // namespace core

#endif  // CORE_TIMING_EVENT_H_
