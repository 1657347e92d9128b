// CUDA errors as absl::Status, the compute stream, and device selection: the small
// CUDA runtime helpers every package's CUDA code shares (target //core:cuda_status).
//
//   // In code built with --config=cuda (FSDP_WITH_CUDA or nvcc):
//   RETURN_IF_ERROR(core::cuda::StatusFromCuda(
//       cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, core::cuda::ComputeStream()),
//       "copying the gradient of 'h.0.mlp.fc.weight'"));
//   // In any build:
//   RETURN_IF_ERROR(core::cuda::Synchronize(core::Device::Cuda(0)));
//
// NOTE [Compute stream]: every core/nn/optim kernel, cuBLAS(Lt) call and device copy runs
// on the legacy default stream of the current device, `ComputeStream()`. Work there is
// ordered, so a kernel may read what the previous one wrote without any event; only code
// on another stream (comm's NCCL stream) orders itself against it with CUDA events.
// Launches are asynchronous: host code sees device results only after a synchronizing
// read (Tensor::ToVector, CopyFrom into a CPU tensor) or Synchronize().
//
// The declarations under FSDP_WITH_CUDA / __CUDACC__ exist only in CUDA code (a target
// with the CUDA_DEFINES local define, or a .cu file); the others exist in every build and
// answer Unavailable for a CUDA device in a build without CUDA.
#ifndef CORE_CUDA_STATUS_H_
#define CORE_CUDA_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/device.h"

#if defined(FSDP_WITH_CUDA) || defined(__CUDACC__)
#include <cuda_runtime_api.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#endif

namespace core {
namespace cuda {

#if defined(FSDP_WITH_CUDA) || defined(__CUDACC__)

// OK for cudaSuccess; otherwise an error whose message is "<what>: <cudaErrorName>
// (<description>)". `what` should name the operation and the tensor / file / rank it is
// about. Codes: cudaErrorMemoryAllocation -> ResourceExhausted; no device, no or too old
// a driver, an invalid device ordinal -> Unavailable; an invalid value -> InvalidArgument;
// anything else (launch failures, illegal addresses, ...) -> Internal. Does not clear the
// runtime's last-error state (see ClearLastError).
inline absl::Status StatusFromCuda(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  std::string message =
      absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(std::move(message));
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
      return absl::UnavailableError(std::move(message));
    case cudaErrorInvalidValue:
      return absl::InvalidArgumentError(std::move(message));
    default:
      return absl::InternalError(std::move(message));
  }
}

// The status of the last kernel launch on this thread (cudaGetLastError, which also
// resets it), as StatusFromCuda(.., what). Call right after a <<<...>>> launch.
inline absl::Status LaunchStatus(absl::string_view what) {
  return StatusFromCuda(cudaGetLastError(), what);
}

// Resets this thread's last CUDA error after a non-sticky failure that was already
// reported (e.g. a cudaMalloc that ran out of memory), so that the next LaunchStatus
// does not report it again.
inline void ClearLastError() { (void)cudaGetLastError(); }

// The compute stream: the legacy default stream of the current device
// (NOTE [Compute stream]).
inline cudaStream_t ComputeStream() { return cudaStreamLegacy; }

#endif  // FSDP_WITH_CUDA || __CUDACC__

// Makes `device` the calling thread's current CUDA device (cudaSetDevice, skipped when it
// already is). OK and a no-op for the CPU. Unavailable for a CUDA device in a build without
// CUDA; the CUDA error, naming the device, otherwise.
absl::Status SetDevice(Device device);

// Waits until all work queued on `device` has finished (cudaDeviceSynchronize on it) and
// reports the first asynchronous error of that work, naming the device. OK and a no-op for
// the CPU; Unavailable for a CUDA device in a build without CUDA.
absl::Status Synchronize(Device device);

}  // namespace cuda
}  // namespace core

#endif  // CORE_CUDA_STATUS_H_
