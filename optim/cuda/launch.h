// Host side of the fused optimizer kernels (only under --config=cuda): numbers the
// segments' chunks, uploads the segment array to the device and launches once.
//
//   std::vector<optim::cuda::AdamWSegment> segs = ...;
//   RETURN_IF_ERROR(optim::cuda::LaunchSegments(device, std::move(segs),
//                                               optim::cuda::FusedAdamW, "AdamW"));
#ifndef OPTIM_CUDA_LAUNCH_H_
#define OPTIM_CUDA_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/device.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "nn/cuda/status.h"
#include "optim/cuda/fused.h"

namespace optim {
namespace cuda {

// Runs `launch` (FusedAdamW or FusedSgd) over `segments`, all on CUDA `device`, on the
// compute stream. The segment array lives in a device tensor (tag kOptim) released on
// return; the copy into it is stream-ordered before the launch. Errors name `what`.
template <typename Segment>
absl::Status LaunchSegments(const core::Device& device, std::vector<Segment> segments,
                            cudaError_t (*launch)(const Segment*, int64_t, int64_t),
                            absl::string_view what) {
  if (segments.empty()) return absl::OkStatus();
  int64_t chunks = 0;
  for (Segment& s : segments) {
    s.first_chunk = chunks;
    chunks += (s.n + kFusedChunk - 1) / kFusedChunk;
  }
  // Empty segments own no chunk; drop them so every chunk maps to a non-empty one.
  std::vector<Segment> live;
  for (const Segment& s : segments) {
    if (s.n > 0) live.push_back(s);
  }
  if (live.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(nn::cuda::StatusFromCuda(cudaSetDevice(device.index),
                                           absl::StrCat(what, ": cudaSetDevice")));
  const int64_t bytes = static_cast<int64_t>(live.size() * sizeof(Segment));
  ASSIGN_OR_RETURN(core::Tensor table,
                   core::Tensor::Allocate({(bytes + 3) / 4}, core::DType::kInt32,
                                          core::MemoryTag::kOptim, device));
  RETURN_IF_ERROR(nn::cuda::StatusFromCuda(
      cudaMemcpyAsync(table.raw_data(), live.data(), static_cast<size_t>(bytes),
                      cudaMemcpyHostToDevice, /*stream=*/0),
      absl::StrCat(what, ": upload of ", live.size(), " segments to ", device.ToString())));
  return nn::cuda::StatusFromCuda(
      launch(static_cast<const Segment*>(table.raw_data()), static_cast<int64_t>(live.size()),
             chunks),
      absl::StrCat(what, ": fused update of ", live.size(), " parameters on ",
                   device.ToString()));
}

}  // namespace cuda
}  // namespace optim

#endif  // OPTIM_CUDA_LAUNCH_H_
