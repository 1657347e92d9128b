// The segment source of the CUDA caching allocator: cudaMalloc / cudaFree on one device,
// for core::BlockPool (core/block_pool.h). Allocator (core/allocator.h) builds one pool
// over this source per CUDA allocator; other code has no reason to use it directly.
//
//   core::BlockPool pool(core::cuda::NewCudaSegmentSource(core::Device::Cuda(0)));
//
// In a build without CUDA the source answers every Allocate with Unavailable.
#ifndef CORE_CUDA_CACHING_ALLOCATOR_H_
#define CORE_CUDA_CACHING_ALLOCATOR_H_

#include <memory>

#include "core/block_pool.h"
#include "core/device.h"

namespace core {
namespace cuda {

// Segments from cudaMalloc on `device` (made current for the call). A cudaMalloc out of
// memory is ResourceExhausted (and the runtime's last error is cleared, so it is not
// reported again by the next kernel launch); no device or driver is Unavailable.
// Free calls cudaFree, which waits for the device's queued work first.
std::unique_ptr<SegmentSource> NewCudaSegmentSource(Device device);

}  // namespace cuda
}  // namespace core

#endif  // CORE_CUDA_CACHING_ALLOCATOR_H_
