#include "core/cuda/caching_allocator.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/cuda_status.h"
#include "core/format_bytes.h"

#ifdef FSDP_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace core {
namespace cuda {
namespace {

class CudaSegmentSource : public SegmentSource {
 public:
  explicit CudaSegmentSource(Device device) : device_(device) {}

  absl::StatusOr<void*> Allocate(int64_t nbytes) override {
#ifdef FSDP_WITH_CUDA
    if (absl::Status s = SetDevice(device_); !s.ok()) return s;
    void* ptr = nullptr;
    const cudaError_t err = cudaMalloc(&ptr, static_cast<size_t>(nbytes));
    if (err != cudaSuccess) {
      // cudaMalloc's errors are not sticky, but they stay the thread's "last error".
      ClearLastError();
      return StatusFromCuda(err, absl::StrCat("cudaMalloc of a ", FormatBytes(nbytes), " (", nbytes,
                                              " bytes) segment on ", device_.ToString()));
    }
    return ptr;
#else
    return absl::UnavailableError(
        absl::StrCat("cannot allocate ", nbytes, " bytes on ", device_.ToString(),
                     ": this build has no CUDA support; build with --config=cuda"));
#endif
  }

  void Free(void* ptr, int64_t nbytes) override {
    (void)nbytes;
#ifdef FSDP_WITH_CUDA
    if (SetDevice(device_).ok()) {
      if (cudaFree(ptr) != cudaSuccess) ClearLastError();
    }
#else
    (void)ptr;
#endif
  }

  std::string Describe() const override { return device_.ToString(); }

 private:
  const Device device_;
};

}  // namespace

std::unique_ptr<SegmentSource> NewCudaSegmentSource(Device device) {
  return std::make_unique<CudaSegmentSource>(device);
}

}  // namespace cuda
}  // namespace core
