// Test-only: what the GPU tests of nn/ (cuda_layers_test, cuda_llama_test; tag "gpu") share
// to run a layer on cuda:0 beside its CPU twin and compare. Tolerances are explained in
// nn/cuda_layers_test.cc.
//
//   TEST(CudaLayersTest, LinearMatchesCpu) {
//     SKIP_WITHOUT_GPU();
//     Linear cpu(45, 23, true, 7), gpu(45, 23, true, 7);
//     CompareModules(cpu, gpu, Normal({3, 5, 45}, 8), kFp32Rel);
//   }
#ifndef NN_TESTING_CUDA_COMPARE_H_
#define NN_TESTING_CUDA_COMPARE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cuda_device.h"
#include "core/module.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace nn {
namespace cuda_compare {

// fp32 on both devices: the 2-norm of (CUDA - CPU) within this much of the CPU's 2-norm.
inline constexpr double kFp32Rel = 1e-5;
// The unit roundoff of bf16, 2^-8.
inline constexpr double kBf16Unit = 1.0 / 256.0;

// Skips the calling test, with the reason, where no CUDA device is usable.
#define SKIP_WITHOUT_GPU()                                                        \
  do {                                                                            \
    absl::StatusOr<int> n = core::CudaDeviceCount();                              \
    if (!n.ok()) GTEST_SKIP() << "no usable CUDA device: " << n.status();         \
    if (*n == 0) GTEST_SKIP() << "no usable CUDA device: CudaDeviceCount() is 0"; \
  } while (0)

inline const core::Device kGpu = core::Device::Cuda(0);

// A copy of `t` on `d`.
core::Tensor To(const core::Tensor& t, const core::Device& d);
// The elements of `t`, copied to the host when it lives on a device.
std::vector<float> Host(const core::Tensor& t);
// An fp32 CPU tensor of N(0, stddev) draws of Rng(seed).
core::Tensor Normal(const core::Shape& shape, uint64_t seed, float stddev = 1.0f);
// int32 CPU ids in [0, num).
core::Tensor Ids(const core::Shape& shape, int64_t num, uint64_t seed);
// ||got - want||_2 / ||want||_2 (absolute when want is 0).
double RelErr(const std::vector<float>& got, const std::vector<float>& want);

// Moves `gpu` (made like `cpu`) to cuda:0, runs both forward on `x` and backward on a fixed
// random gradient; expects outputs, input gradients and every parameter gradient to agree
// within `rel` in the 2-norm.
void CompareModules(core::Module& cpu, core::Module& gpu, const core::Tensor& x, double rel);

// One forward, cross-entropy and backward of a language model on cuda:0: every parameter
// gradient (on the host, in NamedParameters() order) and the activation bytes the forward
// left held on the device. Failures are reported as test failures.
struct LossGradients {
  std::vector<std::vector<float>> grads;
  int64_t activation_bytes_after_forward = 0;
};
LossGradients LanguageModelGradients(core::Module& model, const core::Tensor& tokens,
                                     const core::Tensor& targets);

}  // namespace cuda_compare
}  // namespace nn

#endif  // NN_TESTING_CUDA_COMPARE_H_
