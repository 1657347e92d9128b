// CUDA kernels used by core (built only under --config=cuda).
#ifndef CORE_CUDA_KERNELS_H_
#define CORE_CUDA_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/dtype.h"

namespace core {
namespace cuda {

// Sets `n` elements of `dtype` at device pointer `ptr` to `value`, synchronously.
absl::Status Fill(void* ptr, int64_t n, DType dtype, float value);

}  // namespace cuda
}  // namespace core

#endif  // CORE_CUDA_KERNELS_H_
