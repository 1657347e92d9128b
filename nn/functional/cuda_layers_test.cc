// GPU tests (tag "gpu") of nn/functional's layer-level ops: each op's output and input
// gradients on cuda:0 against the CPU's, and the CUDA-only paths (ids and targets on the
// host or the device, parameters on the device). Skipped, with the reason, where no CUDA
// device is usable (builds without --config=cuda, machines without a GPU).
//
// Tolerances (nn/cuda_layers_test.cc explains them): fp32 results agree within kFp32Rel of
// the CPU's 2-norm, as both devices compute in fp32 and differ only in summation order (and
// the CUDA rows' exponentials, kernels::RowExp). With bf16 weights both devices take the same
// bf16 operands (the same seed gradient is rounded on both) and accumulate in fp32, so only
// the order of the fp32 sums differs; the bound is 10x looser for cuBLAS's bf16 kernels.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "core/cuda_device.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "nn/functional/embedding.h"
#include "nn/functional/internal/device_test_util.h"
#include "nn/functional/internal/layer_test_util.h"
#include "nn/functional/linear.h"
#include "nn/functional/loss.h"
#include "nn/functional/norm.h"
#include "nn/functional/softmax.h"
#include "nn/testing/cuda_compare.h"

namespace nn {
namespace functional {
namespace {

using core::DType;
using core::Tensor;
using cuda_compare::Host;
using cuda_compare::Ids;
using cuda_compare::kFp32Rel;
using cuda_compare::kGpu;
using cuda_compare::Normal;
using cuda_compare::RelErr;
using cuda_compare::To;
using device_test_util::AgreeOptions;
using device_test_util::DeviceFn;
using device_test_util::ExpectDevicesAgree;
using device_test_util::OneOutput;
using layer_test_util::Bf16;

TEST(CudaFunctionalLayersTest, MatMulAndLinearMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const DeviceFn matmul = [](const std::vector<Tensor>& in, const core::Device&) {
    return OneOutput(MatMul(in[0], in[1]));
  };
  ExpectDevicesAgree("batched MatMul", matmul, {Normal({2, 3, 17, 9}, 1), Normal({2, 3, 9, 11}, 2)},
                     kFp32Rel);
  ExpectDevicesAgree("MatMul with a shared b", matmul, {Normal({4, 17, 9}, 3), Normal({9, 11}, 4)},
                     kFp32Rel);
  const DeviceFn linear = [](const std::vector<Tensor>& in, const core::Device&) {
    return OneOutput(Linear(in[0], in[1], in[2]));
  };
  ExpectDevicesAgree("fp32 Linear", linear,
                     {Normal({3, 5, 45}, 5), Normal({23, 45}, 6), Normal({23}, 7)}, kFp32Rel);
  ExpectDevicesAgree("bf16 Linear", linear,
                     {Normal({3, 5, 45}, 5), Bf16(Normal({23, 45}, 6)), Bf16(Normal({23}, 7))},
                     10 * kFp32Rel);
}

// NOTE [Functional Linear]: parameters on the device get their gradients added into
// Parameter::grad there.
TEST(CudaFunctionalLayersTest, LinearAddsIntoDeviceParameterGradients) {
  SKIP_WITHOUT_GPU();
  const Tensor x = Normal({6, 8}, 1), w = Normal({5, 8}, 2), b = Normal({5}, 3);
  const Tensor g = Normal({6, 5}, 4);
  std::vector<std::vector<float>> grads[2];
  for (int d = 0; d < 2; ++d) {
    const core::Device device = d == 0 ? core::Device::Cpu() : kGpu;
    core::ParameterPtr pw = core::Parameter::Make(d == 0 ? w : To(w, device));
    core::ParameterPtr pb = core::Parameter::Make(d == 0 ? b : To(b, device));
    absl::StatusOr<Tensor> y = Linear(d == 0 ? x : To(x, device), pw, pb);
    ASSERT_TRUE(y.ok()) << y.status();
    ASSERT_TRUE(core::Backward({*y}, {d == 0 ? g : To(g, device)}).ok());
    ASSERT_EQ(pw->grad.device(), device);
    grads[d] = {Host(pw->grad), Host(pb->grad)};
  }
  EXPECT_LE(RelErr(grads[1][0], grads[0][0]), kFp32Rel);
  EXPECT_LE(RelErr(grads[1][1], grads[0][1]), kFp32Rel);
}

TEST(CudaFunctionalLayersTest, NormsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  ExpectDevicesAgree(
      "LayerNorm",
      [](const std::vector<Tensor>& in, const core::Device&) {
        return OneOutput(LayerNorm(in[0], in[1], in[2]));
      },
      {Normal({4, 7, 96}, 1), Normal({96}, 2), Normal({96}, 3)}, kFp32Rel);
  ExpectDevicesAgree(
      "RmsNorm",
      [](const std::vector<Tensor>& in, const core::Device&) {
        return OneOutput(RmsNorm(in[0], in[1]));
      },
      {Normal({4, 7, 96}, 4), Normal({96}, 5)}, kFp32Rel);
}

TEST(CudaFunctionalLayersTest, EmbeddingMatchesTheCpuWithIdsOnEitherDevice) {
  SKIP_WITHOUT_GPU();
  const DeviceFn embedding = [](const std::vector<Tensor>& in, const core::Device&) {
    return OneOutput(Embedding(in[0], in[1]));
  };
  for (bool ids_on_device : {true, false}) {
    AgreeOptions ids;
    ids.ids_on_device = ids_on_device;
    ExpectDevicesAgree(absl::StrCat("Embedding, ids on the device: ", ids_on_device), embedding,
                       {Ids({3, 11}, 50, 1), Normal({50, 24}, 2)}, kFp32Rel, ids);
  }
  // Ids on the device are checked on the host too.
  const Tensor bad = To(Tensor::FromInts({7, 55}, {2}).value(), kGpu);
  absl::Status s = Embedding(bad, To(Normal({50, 4}, 4), kGpu)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("id 55 at flat position 1"), std::string::npos) << s;
}

TEST(CudaFunctionalLayersTest, SoftmaxRowsMatchTheCpuAndRepeatBitForBit) {
  SKIP_WITHOUT_GPU();
  // Rows shorter than a warp, of a few warps, and long.
  for (int64_t cols : {5, 97, 4099}) {
    ExpectDevicesAgree(
        absl::StrCat("Softmax of ", cols),
        [](const std::vector<Tensor>& in, const core::Device&) {
          return OneOutput(Softmax(in[0]));
        },
        {Normal({33, cols}, 1, 3.0f)}, kFp32Rel);
    ExpectDevicesAgree(
        absl::StrCat("LogSoftmax of ", cols),
        [](const std::vector<Tensor>& in, const core::Device&) {
          return OneOutput(LogSoftmax(in[0]));
        },
        {Normal({33, cols}, 2, 3.0f)}, kFp32Rel);
  }
  const Tensor x = To(Normal({64, 1000}, 3), kGpu);
  absl::StatusOr<Tensor> a = Softmax(x), b = Softmax(x);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(Host(*a), Host(*b));
}

TEST(CudaFunctionalLayersTest, LossesMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (bool targets_on_device : {true, false}) {
    AgreeOptions targets_on;
    targets_on.ids_on_device = targets_on_device;
    const DeviceFn ce = [](const std::vector<Tensor>& in, const core::Device&) {
      return OneOutput(CrossEntropy(in[0], in[1]));
    };
    ExpectDevicesAgree(absl::StrCat("CrossEntropy, targets on the device: ", targets_on_device), ce,
                       {Normal({4, 9, 301}, 1, 2.0f), Ids({4, 9}, 301, 2)}, kFp32Rel, targets_on);
    Tensor targets = Ids({4, 9}, 301, 3);
    for (int i = 0; i < 36; i += 5) targets.data<int32_t>()[i] = -100;
    ExpectDevicesAgree(
        absl::StrCat("CrossEntropy with ignored targets, on the device: ", targets_on_device), ce,
        {Normal({4, 9, 301}, 4, 2.0f), targets}, kFp32Rel, targets_on);
  }
  ExpectDevicesAgree(
      "Mse",
      [](const std::vector<Tensor>& in, const core::Device&) {
        return OneOutput(Mse(in[0], in[1]));
      },
      {Normal({5, 13}, 5), Normal({5, 13}, 6)}, kFp32Rel);
}

}  // namespace
}  // namespace functional
}  // namespace nn
