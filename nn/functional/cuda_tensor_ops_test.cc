// GPU tests (tag "gpu"): nn/functional's elementwise, shape and reduce ops on cuda:0
// against the CPU, outputs and input gradients. Skipped, with the reason, where no CUDA
// device is usable (builds without --config=cuda, machines without a driver or GPU).
//
// Tolerances: the ops whose bits are promised on both devices (copies, gathers, scatters,
// sums: NOTE [Sum order], NOTE [Index checks]; single-rounding binary ops) must agree
// exactly; the unary activations (their polynomials may fuse into FMAs under nvcc) within
// kFp32Rel in the 2-norm.
#include <cstdint>
#include <functional>
#include <vector>

#include "core/autograd.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "nn/functional/elementwise.h"
#include "nn/functional/reduce.h"
#include "nn/functional/shape.h"
#include "nn/testing/cuda_compare.h"

namespace nn {
namespace functional {
namespace {

using core::Tensor;
using cuda_compare::Host;
using cuda_compare::kFp32Rel;
using cuda_compare::kGpu;
using cuda_compare::Normal;
using cuda_compare::RelErr;
using cuda_compare::To;

using Fn = std::function<absl::StatusOr<std::vector<Tensor>>(const std::vector<Tensor>&)>;

Tensor Ints(const std::vector<int32_t>& v, const core::Shape& shape) {
  return Tensor::FromInts(v, shape).value();
}

// What one device computed: the outputs, then the fp32 inputs' gradients, on the host.
std::vector<std::vector<float>> RunOn(const core::Device& device, const Fn& fn,
                                      const std::vector<Tensor>& inputs) {
  std::vector<Tensor> in;
  for (const Tensor& t : inputs) {
    const Tensor d = To(t, device);
    in.push_back(t.dtype() == core::DType::kFloat32 ? core::Leaf(d) : d);
  }
  absl::StatusOr<std::vector<Tensor>> outs = fn(in);
  EXPECT_TRUE(outs.ok()) << outs.status();
  if (!outs.ok()) return {};
  std::vector<std::vector<float>> seen;
  std::vector<Tensor> roots, seeds;
  for (size_t k = 0; k < outs->size(); ++k) {
    const Tensor& y = (*outs)[k];
    EXPECT_TRUE(y.device() == device) << y.ToString();
    seen.push_back(Host(y));
    if (!core::RequiresGrad(y)) continue;
    roots.push_back(y);
    seeds.push_back(To(Normal(y.shape(), 100 + k), device));
  }
  const absl::Status s = core::Backward(roots, seeds);
  EXPECT_TRUE(s.ok()) << s;
  for (const Tensor& t : in) {
    if (t.dtype() == core::DType::kFloat32) seen.push_back(Host(core::LeafGrad(t)));
  }
  return seen;
}

// Expects fn's outputs and input gradients on cuda:0 within `rel` of the CPU's (0: bits).
void ExpectDevicesAgree(const Fn& fn, const std::vector<Tensor>& inputs, double rel = 0.0) {
  const std::vector<std::vector<float>> cpu = RunOn(core::Device::Cpu(), fn, inputs);
  const std::vector<std::vector<float>> gpu = RunOn(kGpu, fn, inputs);
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (rel == 0.0) {
      EXPECT_EQ(gpu[i], cpu[i]) << "result " << i;
    } else {
      EXPECT_LE(RelErr(gpu[i], cpu[i]), rel) << "result " << i;
    }
  }
}

TEST(CudaTensorOpsTest, BinaryOpsWithBroadcastingHaveTheCpuBits) {
  SKIP_WITHOUT_GPU();
  for (auto op : {Add, Sub, Mul, Div}) {
    ExpectDevicesAgree(
        [op](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
          ASSIGN_OR_RETURN(Tensor b, AddScalar(in[1], 3.0f));  // divisors away from 0
          ASSIGN_OR_RETURN(Tensor y, op(in[0], b));            // [5, 1, 7] with [3, 1]
          ASSIGN_OR_RETURN(Tensor z, op(in[2], in[2]));        // same shapes
          ASSIGN_OR_RETURN(Tensor w, MulScalar(z, -0.5f));
          return std::vector<Tensor>{y, w};
        },
        {Normal({5, 1, 7}, 1), Normal({3, 1}, 2, 0.1f), Normal({1000, 3}, 3)});
  }
}

TEST(CudaTensorOpsTest, ActivationsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (auto op : {Gelu, Relu, Silu, Softplus, Tanh}) {
    ExpectDevicesAgree(
        [op](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
          ASSIGN_OR_RETURN(Tensor y, op(in[0]));
          return std::vector<Tensor>{y};
        },
        {Normal({33, 65}, 4, 3.0f)}, kFp32Rel);
  }
}

TEST(CudaTensorOpsTest, ShapeOpsHaveTheCpuBits) {
  SKIP_WITHOUT_GPU();
  ExpectDevicesAgree(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor r, Reshape(in[0], {4, -1, 5}));
        ASSIGN_OR_RETURN(Tensor p, Permute(r, {2, 0, 1}));
        ASSIGN_OR_RETURN(Tensor t, Transpose(in[0], 0, -1));
        ASSIGN_OR_RETURN(Tensor s, Slice(in[0], 1, 2, -1));
        ASSIGN_OR_RETURN(Tensor c, Cat({in[0], s, in[0]}, 1));
        ASSIGN_OR_RETURN(std::vector<Tensor> parts, Split(c, {3, 9, 0, 1}, -1));
        return std::vector<Tensor>{p, t, c, parts[0], parts[1], parts[3]};
      },
      {Normal({4, 6, 5}, 5)});
}

TEST(CudaTensorOpsTest, IndexOpsHaveTheCpuBitsWithRepeatedIndices) {
  SKIP_WITHOUT_GPU();
  std::vector<int32_t> rows(50), gather(6 * 40), scatter(6 * 30);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int32_t>(i * 7 % 9);
  for (size_t i = 0; i < gather.size(); ++i) gather[i] = static_cast<int32_t>(i * 5 % 11 % 8);
  for (size_t i = 0; i < scatter.size(); ++i) scatter[i] = static_cast<int32_t>(i * 3 % 8);
  ExpectDevicesAgree(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor a, IndexSelect(in[0], 0, in[2]));  // [9, 8] -> [50, 8]
        ASSIGN_OR_RETURN(Tensor b, Gather(in[0], 1, in[3]));       // [6, 40] of [9, 8]
        ASSIGN_OR_RETURN(Tensor c, ScatterAdd(in[0], 1, in[4], in[1]));
        return std::vector<Tensor>{a, b, c};
      },
      {Normal({9, 8}, 6), Normal({7, 31}, 7), Ints(rows, {50}), Ints(gather, {6, 40}),
       Ints(scatter, {6, 30})});
}

// NOTE [Index checks]: on CUDA an out-of-range index reads 0 and writes nothing.
TEST(CudaTensorOpsTest, OutOfRangeIndicesAreSkippedOnTheDevice) {
  SKIP_WITHOUT_GPU();
  const Tensor x = To(Tensor::FromVector({1, 2, 3, 4}, {2, 2}).value(), kGpu);
  const Tensor bad = To(Ints({1, 7, -1, 0}, {2, 2}), kGpu);
  absl::StatusOr<Tensor> g = Gather(x, 1, bad);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(Host(*g), (std::vector<float>{2, 0, 0, 3}));
  absl::StatusOr<Tensor> s = ScatterAdd(x, 1, bad, To(Normal({2, 2}, 8), kGpu));
  ASSERT_TRUE(s.ok()) << s.status();
  const std::vector<float> sv = Host(*s), src = Normal({2, 2}, 8).ToVector();
  EXPECT_EQ(sv, (std::vector<float>{1, 2 + src[0], 3 + src[3], 4}));
}

TEST(CudaTensorOpsTest, ReductionsHaveTheCpuBits) {
  SKIP_WITHOUT_GPU();
  ExpectDevicesAgree(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor all, Sum(in[0]));         // several chunks
        ASSIGN_OR_RETURN(Tensor rows, Mean(in[0], {0}));  // strided terms
        ASSIGN_OR_RETURN(Tensor some, Sum(in[1], {0, 2}, true));
        ASSIGN_OR_RETURN(std::vector<Tensor> m, Max(in[1], -1));
        ASSIGN_OR_RETURN(Tensor to, SumToShape(in[1], {5, 1}));
        ASSIGN_OR_RETURN(Tensor bc, BroadcastTo(in[2], {3, 5, 7}));
        return std::vector<Tensor>{all, rows, some, m[0], m[1], to, bc};
      },
      {Normal({9000, 3}, 9), Normal({3, 5, 7}, 10), Normal({5, 1}, 11)});
}

}  // namespace
}  // namespace functional
}  // namespace nn
