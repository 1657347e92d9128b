// absl::Status from CUDA runtime and cuBLAS return codes, for nn/ and optim/ (only under
// --config=cuda).
//
//   RETURN_IF_ERROR(nn::cuda::StatusFromCuda(cudaGetLastError(), "GELU of blocks.0.mlp"));
#ifndef NN_CUDA_STATUS_H_
#define NN_CUDA_STATUS_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace nn {
namespace cuda {

// OK for cudaSuccess; otherwise Internal (ResourceExhausted for out of memory)
// "<what>: <CUDA error name>: <description>".
inline absl::Status StatusFromCuda(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

// OK for CUBLAS_STATUS_SUCCESS; otherwise Internal "<what>: cuBLAS status <name> (<code>)".
inline absl::Status StatusFromCublas(cublasStatus_t status, absl::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": cuBLAS status ", cublasLtGetStatusName(status),
                                           " (", static_cast<int>(status), ")");
  if (status == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

}  // namespace cuda
}  // namespace nn

#endif  // NN_CUDA_STATUS_H_
