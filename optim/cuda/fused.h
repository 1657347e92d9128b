// Fused multi-tensor optimizer kernels (only under --config=cuda): one launch updates
// every parameter of an optimizer on one device, whatever their number, through a device
// array of segments (one per parameter or contiguous flat shard). The element math is
// nn/kernels/optim.h's, the same the CPU loops run.
//
//   std::vector<optim::cuda::AdamWSegment> host = ...;   // one per stepping parameter
//   // copy `host` into device memory `segs` (cudaMemcpyAsync on the compute stream), then:
//   cudaError_t err = optim::cuda::FusedAdamW(segs, host.size(), total_chunks);
#ifndef OPTIM_CUDA_FUSED_H_
#define OPTIM_CUDA_FUSED_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "nn/kernels/optim.h"

namespace optim {
namespace cuda {

// Elements one thread block updates.
constexpr int64_t kFusedChunk = 2048;

struct AdamWSegment {
  float* w = nullptr;
  const float* g = nullptr;
  float* m = nullptr;  // exp_avg
  float* v = nullptr;  // exp_avg_sq
  int64_t n = 0;
  int64_t first_chunk = 0;  // sum of ceil(n / kFusedChunk) over the segments before
  nn::kernels::AdamWScalars s;
};

struct SgdSegment {
  float* w = nullptr;
  const float* g = nullptr;
  float* buf = nullptr;  // momentum buffer, or null without momentum
  int64_t n = 0;
  int64_t first_chunk = 0;
  nn::kernels::SgdScalars s;
};

// Updates every element of the `num_segments` segments at device address `segments`
// (sorted by first_chunk, `total_chunks` = the last first_chunk plus its chunk count) in
// one launch on the compute stream. Returns the launch error.
cudaError_t FusedAdamW(const AdamWSegment* segments, int64_t num_segments, int64_t total_chunks);
cudaError_t FusedSgd(const SgdSegment* segments, int64_t num_segments, int64_t total_chunks);

}  // namespace cuda
}  // namespace optim

#endif  // OPTIM_CUDA_FUSED_H_
