// Fused multi-tensor optimizer kernels (only under --config=cuda): one launch updates
// every parameter of an optimizer on one device, whatever their number, through a device
// array of segments (one per parameter or contiguous flat shard). The element math is
// kernels/optim.h's, the same the CPU loops run.
//
//   std::vector<kernels::AdamWSegment> host = ...;   // one per stepping parameter
//   // number their chunks (first_chunk), copy `host` into device memory `segs`
//   // (cudaMemcpyAsync on the compute stream), then:
//   cudaError_t err = kernels::cuda::FusedAdamW(segs, host.size(), total_chunks);
//
// kernels::OptimizerStep (kernels/optim_step.h) does all of that; optimizers use it.
#ifndef KERNELS_CUDA_FUSED_H_
#define KERNELS_CUDA_FUSED_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "kernels/optim.h"

namespace kernels {
namespace cuda {

// Elements one thread block updates.
constexpr int64_t kFusedChunk = 2048;

// Updates every element of the `num_segments` segments at device address `segments`
// (sorted by first_chunk, `total_chunks` = the last first_chunk plus its chunk count) in
// one launch on the compute stream. Returns the launch error.
cudaError_t FusedAdamW(const AdamWSegment* segments, int64_t num_segments, int64_t total_chunks);
cudaError_t FusedSgd(const SgdSegment* segments, int64_t num_segments, int64_t total_chunks);

}  // namespace cuda
}  // namespace kernels

#endif  // KERNELS_CUDA_FUSED_H_
