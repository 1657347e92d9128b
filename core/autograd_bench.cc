// Micro-benchmark of the autograd bookkeeping (NOTE [Autograd] in core/autograd.h): a chain
// of N tiny ops (y = y * c on a few elements, written as a custom function with
// core::RecordFunction, as nn/functional writes its ops), timed four ways: the forward under
// NoGradScope (the op alone: allocation and math), the forward with grad mode on (the op plus
// recording its node and saved tensor) and the Backward through the chain (the engine: the
// ready queue, gradient delivery, the node's backward with its allocation and math, freeing
// the saved tensor), and the backward's own work (a fresh gradient tensor and the math) called
// directly in a chain. record = grad forward - no-grad forward, engine = Backward - the work
// alone, bookkeeping = record + engine. Median of 7 runs; prints one JSON object.
//
//   bazel run -c opt //core:autograd_bench
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "core/autograd.h"
#include "core/status_macros.h"
#include "core/tensor.h"

namespace {

constexpr int64_t kOps = 20000;
constexpr int64_t kNumel = 4;
constexpr int kRuns = 7;

// The backward's own work: a fresh gradient tensor and g * c.
absl::StatusOr<core::Tensor> ScaleBackward(const core::Tensor& g, const core::Tensor& c) {
  ASSIGN_OR_RETURN(core::Tensor gx, core::Tensor::Allocate(g.shape(), core::DType::kFloat32,
                                                           core::MemoryTag::kActivation));
  for (int64_t i = 0; i < g.numel(); ++i) {
    gx.data<float>()[i] = g.data<float>()[i] * c.data<float>()[i];
  }
  return gx;
}

absl::StatusOr<core::Tensor> Scale(core::Arg x_arg, const core::Tensor& c) {
  RETURN_IF_ERROR(x_arg.status());
  const core::Tensor& x = x_arg.tensor();
  ASSIGN_OR_RETURN(core::Tensor y, core::Tensor::Allocate(x.shape(), core::DType::kFloat32,
                                                          core::MemoryTag::kActivation));
  for (int64_t i = 0; i < x.numel(); ++i)
    y.data<float>()[i] = x.data<float>()[i] * c.data<float>()[i];
  RETURN_IF_ERROR(core::RecordFunction(
      "Scale", {x}, {&y}, {c},
      [](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<core::Tensor>> {
        ASSIGN_OR_RETURN(core::Tensor gx, ScaleBackward(ctx.grad(0), ctx.saved(0)));
        return std::vector<core::Tensor>{gx};
      },
      {"c"}));
  return y;
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

absl::Status Run() {
  const core::Tensor c = core::Tensor::FromVector({1.0f, 0.5f, 2.0f, 1.0f}, {kNumel}).value();
  std::vector<double> no_grad, with_grad, backward, backward_work;
  for (int run = 0; run < kRuns; ++run) {
    const core::Tensor x0 = core::Tensor::FromVector({1, 2, 3, 4}, {kNumel}).value();
    {
      core::NoGradScope off;
      core::Tensor y = core::Leaf(x0);
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < kOps; ++i) {
        ASSIGN_OR_RETURN(y, Scale(y, c));
      }
      no_grad.push_back(Seconds(t0, std::chrono::steady_clock::now()));
    }
    core::Tensor x = core::Leaf(x0);
    core::Tensor y = x;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < kOps; ++i) {
      ASSIGN_OR_RETURN(y, Scale(y, c));
    }
    const auto t1 = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(
        core::Backward({y}, {core::Tensor::FromVector({1, 1, 1, 1}, {kNumel}).value()}));
    const auto t2 = std::chrono::steady_clock::now();
    with_grad.push_back(Seconds(t0, t1));
    backward.push_back(Seconds(t1, t2));
    // The same backward work without the engine: kOps calls in a chain.
    core::Tensor g = core::Tensor::FromVector({1, 1, 1, 1}, {kNumel}).value();
    const auto t3 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < kOps; ++i) {
      ASSIGN_OR_RETURN(g, ScaleBackward(g, c));
    }
    backward_work.push_back(Seconds(t3, std::chrono::steady_clock::now()));
    if (!core::LeafGrad(x).defined()) return absl::InternalError("no gradient reached the leaf");
  }
  const double ns = 1e9 / kOps;
  const double fwd0 = Median(no_grad) * ns, fwd1 = Median(with_grad) * ns;
  const double bwd = Median(backward) * ns, work = Median(backward_work) * ns;
  std::printf(
      "{\"benchmark\":\"autograd_bookkeeping\",\"ops\":%lld,\"numel\":%lld,\"runs\":%d,"
      "\"forward_no_grad_ns_per_op\":%.1f,\"forward_grad_ns_per_op\":%.1f,"
      "\"record_ns_per_op\":%.1f,\"backward_ns_per_op\":%.1f,"
      "\"backward_work_alone_ns_per_op\":%.1f,\"engine_ns_per_op\":%.1f,"
      "\"bookkeeping_ns_per_op\":%.1f,\"target_ns_per_op\":1000}\n",
      static_cast<long long>(kOps), static_cast<long long>(kNumel), kRuns, fwd0, fwd1, fwd1 - fwd0,
      bwd, work, bwd - work, fwd1 - fwd0 + bwd - work);
  return absl::OkStatus();
}

}  // namespace

int main() {
  const absl::Status s = Run();
  if (!s.ok()) {
    std::fprintf(stderr, "autograd_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
