#include "nn/tensor_ops.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/kernels/elementwise.h"
#include "nn/kernels/math.h"
#include "nn/kernels/rowwise.h"
#include "nn/ops.h"

#ifdef FSDP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "nn/cuda/gemm.h"
#include "nn/cuda/kernels.h"
#include "nn/cuda/status.h"
#endif

namespace nn {
namespace {

namespace k = ::nn::kernels;
using core::DType;
using core::Tensor;

struct Arg {
  const char* name;
  const Tensor* tensor;
};

std::string Describe(const Tensor& t) {
  return t.defined() ? t.ToString() : std::string("undefined");
}

// OK when every tensor in `args` is defined and on the device of the first.
absl::Status CheckDevices(absl::string_view what, std::initializer_list<Arg> args) {
  const Arg* first = nullptr;
  for (const Arg& a : args) {
    if (!a.tensor->defined()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", a.name, " is undefined"));
    }
    if (first == nullptr) {
      first = &a;
    } else if (a.tensor->device() != first->tensor->device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": ", a.name, " ", a.tensor->ToString(), " is on ",
          a.tensor->device().ToString(), " but ", first->name, " ", first->tensor->ToString(),
          " is on ", first->tensor->device().ToString(), "; all operands must share a device"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckDType(absl::string_view what, const char* name, const Tensor& t, DType dtype) {
  if (t.dtype() != dtype) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", name, " must be ",
                                                   core::DTypeName(dtype), ", got ", Describe(t)));
  }
  return absl::OkStatus();
}

absl::Status CheckWeightDType(absl::string_view what, const char* name, const Tensor& t) {
  if (t.dtype() != DType::kFloat32 && t.dtype() != DType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", name, " must be float32 or bfloat16, got ", Describe(t)));
  }
  return absl::OkStatus();
}

absl::Status CheckNumel(absl::string_view what, const char* name, const Tensor& t, int64_t numel) {
  if (t.numel() != numel) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", name, " must have ", numel,
                                                   " elements, got ", Describe(t)));
  }
  return absl::OkStatus();
}

bool IsBf16(const Tensor& t) { return t.dtype() == DType::kBFloat16; }

// Calls f(const float*) or f(const uint16_t*) on a weight's elements.
template <typename F>
void WithWeight(const Tensor& t, F&& f) {
  if (IsBf16(t)) {
    f(static_cast<const uint16_t*>(t.raw_data()));
  } else {
    f(static_cast<const float*>(t.raw_data()));
  }
}

#ifdef FSDP_WITH_CUDA
absl::Status UseDevice(const core::Device& d, absl::string_view what) {
  return cuda::StatusFromCuda(cudaSetDevice(d.index),
                              absl::StrCat(what, ": cudaSetDevice(", d.index, ")"));
}
absl::Status Launched(cudaError_t err, absl::string_view what, absl::string_view op) {
  return cuda::StatusFromCuda(err, absl::StrCat(what, ": CUDA ", op));
}
#define NN_ON_CUDA(device, what, op, call)  \
  do {                                      \
    RETURN_IF_ERROR(UseDevice(device, what)); \
    return Launched((call), what, op);      \
  } while (0)
#else
absl::Status NoCuda(const core::Device& d, absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(
      what, ": tensors are on ", d.ToString(), " but this build has no CUDA support; build with "
      "--config=cuda"));
}
#define NN_ON_CUDA(device, what, op, call) return NoCuda(device, what)
#endif

const float* F32(const Tensor& t) { return static_cast<const float*>(t.raw_data()); }
float* MutF32(const Tensor& t) { return static_cast<float*>(t.raw_data()); }

// ---- MatMul helpers.

struct Stored {
  int64_t rows, cols, ld;
};

// The stored shape of an operand and its row stride (ld 0 means dense).
Stored StoredShape(bool trans, int64_t rows, int64_t cols, int64_t ld) {
  Stored s{trans ? cols : rows, trans ? rows : cols, ld};
  if (s.ld == 0) s.ld = std::max<int64_t>(s.cols, 1);
  return s;
}

// Number of elements from the operand's first element to one past its last, or an error
// when it does not lie inside its tensor.
absl::StatusOr<int64_t> CheckExtent(absl::string_view what, const char* name, const MatrixRef& r,
                                    const Stored& s, int64_t batch) {
  if (r.offset < 0 || r.batch_stride < 0 || s.ld < s.cols) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": GEMM operand ", name, " has offset ", r.offset, ", row stride ",
                     s.ld, " (< ", s.cols, " columns?) and batch stride ", r.batch_stride));
  }
  if (batch == 0 || s.rows == 0 || s.cols == 0) return int64_t{0};
  const __int128 span = static_cast<__int128>(batch - 1) * r.batch_stride +
                        static_cast<__int128>(s.rows - 1) * s.ld + s.cols;
  if (static_cast<__int128>(r.offset) + span > r.tensor.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": GEMM operand ", name, " (", batch, " x [", s.rows, ", ", s.cols, "], row stride ",
        s.ld, ", batch stride ", r.batch_stride, ", offset ", r.offset, ") reaches outside ",
        r.tensor.ToString()));
  }
  return static_cast<int64_t>(span);
}

// A widened fp32 copy of elements [offset, offset + span) of a bf16 CPU tensor.
std::vector<float> WidenSpan(const Tensor& t, int64_t offset, int64_t span) {
  std::vector<float> out(static_cast<size_t>(span));
  const uint16_t* p = static_cast<const uint16_t*>(t.raw_data()) + offset;
  for (int64_t i = 0; i < span; ++i) out[i] = k::Bf16ToFloat(p[i]);
  return out;
}

}  // namespace

absl::Status MatMul(absl::string_view what, const GemmArgs& g) {
  RETURN_IF_ERROR(CheckDevices(what, {{"A", &g.a.tensor}, {"B", &g.b.tensor}, {"C", &g.c.tensor}}));
  RETURN_IF_ERROR(CheckWeightDType(what, "GEMM operand A", g.a.tensor));
  RETURN_IF_ERROR(CheckWeightDType(what, "GEMM operand B", g.b.tensor));
  RETURN_IF_ERROR(CheckDType(what, "GEMM output C", g.c.tensor, DType::kFloat32));
  if (g.batch < 0 || g.m < 0 || g.n < 0 || g.k < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": GEMM sizes must be >= 0, got batch ",
                                                   g.batch, " m ", g.m, " n ", g.n, " k ", g.k));
  }
  const Stored sa = StoredShape(g.trans_a, g.m, g.k, g.a.ld);
  const Stored sb = StoredShape(g.trans_b, g.k, g.n, g.b.ld);
  const Stored sc = StoredShape(false, g.m, g.n, g.c.ld);
  ASSIGN_OR_RETURN(int64_t span_a, CheckExtent(what, "A", g.a, sa, g.batch));
  ASSIGN_OR_RETURN(int64_t span_b, CheckExtent(what, "B", g.b, sb, g.batch));
  RETURN_IF_ERROR(CheckExtent(what, "C", g.c, sc, g.batch).status());
  if (g.batch == 0 || g.m == 0 || g.n == 0) return absl::OkStatus();
  const core::Device device = g.c.tensor.device();

  if (device.is_cuda()) {
#ifdef FSDP_WITH_CUDA
    RETURN_IF_ERROR(UseDevice(device, what));
    float* c = MutF32(g.c.tensor) + g.c.offset;
    if (g.k == 0) {
      return Launched(cuda::ScaleMatrices(c, g.batch, g.m, g.n, sc.ld, g.c.batch_stride, g.beta),
                      what, "GEMM with k == 0 (scale C)");
    }
    const int64_t esize_a = core::DTypeSize(g.a.tensor.dtype());
    const int64_t esize_b = core::DTypeSize(g.b.tensor.dtype());
    cuda::GemmOperand a{static_cast<const char*>(g.a.tensor.raw_data()) + g.a.offset * esize_a,
                        IsBf16(g.a.tensor), sa.ld, g.a.batch_stride};
    cuda::GemmOperand b{static_cast<const char*>(g.b.tensor.raw_data()) + g.b.offset * esize_b,
                        IsBf16(g.b.tensor), sb.ld, g.b.batch_stride};
    cuda::GemmOperand cc{c, false, sc.ld, g.c.batch_stride};
    // Mixed fp32 x bf16: round the fp32 operand to bf16 (same layout) first. The scratch
    // is released on return; the caching allocator orders its reuse on this stream.
    Tensor scratch;
    if (a.bf16 != b.bf16) {
      cuda::GemmOperand& f32 = a.bf16 ? b : a;
      const int64_t span = a.bf16 ? span_b : span_a;
      ASSIGN_OR_RETURN(scratch, Tensor::Allocate({span}, DType::kBFloat16,
                                                 core::MemoryTag::kActivation, device));
      RETURN_IF_ERROR(Launched(cuda::RoundToBf16(static_cast<const float*>(f32.ptr),
                                                 static_cast<uint16_t*>(scratch.raw_data()), span),
                               what, "round GEMM operand to bf16"));
      f32.ptr = scratch.raw_data();
      f32.bf16 = true;
    }
    return cuda::Gemm(device.index, g.trans_a, g.trans_b, g.batch, g.m, g.n, g.k, g.alpha, a, b,
                      g.beta, cc, what);
#else
    return NoCuda(device, what);
#endif
  }

  // CPU: OpenBLAS sgemm per matrix of the batch; bf16 operands are widened exactly.
  std::vector<float> wide_a, wide_b;
  const float* a = nullptr;
  const float* b = nullptr;
  if (IsBf16(g.a.tensor)) {
    wide_a = WidenSpan(g.a.tensor, g.a.offset, span_a);
    a = wide_a.data();
  } else {
    a = F32(g.a.tensor) + g.a.offset;
  }
  if (IsBf16(g.b.tensor)) {
    wide_b = WidenSpan(g.b.tensor, g.b.offset, span_b);
    b = wide_b.data();
  } else {
    b = F32(g.b.tensor) + g.b.offset;
  }
  float* c = MutF32(g.c.tensor) + g.c.offset;
  for (int64_t i = 0; i < g.batch; ++i) {
    Gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, a + i * g.a.batch_stride, sa.ld,
         b + i * g.b.batch_stride, sb.ld, g.beta, c + i * g.c.batch_stride, sc.ld);
  }
  return absl::OkStatus();
}

absl::Status GeluForward(absl::string_view what, const Tensor& x, const Tensor& y) {
  RETURN_IF_ERROR(CheckDevices(what, {{"input", &x}, {"output", &y}}));
  RETURN_IF_ERROR(CheckDType(what, "input", x, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "output", y, DType::kFloat32));
  RETURN_IF_ERROR(CheckNumel(what, "output", y, x.numel()));
  const int64_t n = x.numel();
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "GELU forward", cuda::GeluForward(F32(x), MutF32(y), n));
  }
  const float* in = F32(x);
  float* out = MutF32(y);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = k::GeluTanhForward(in[i]);
  return absl::OkStatus();
}

absl::Status GeluBackward(absl::string_view what, const Tensor& x, const Tensor& gy,
                          const Tensor& gx) {
  RETURN_IF_ERROR(CheckDevices(what, {{"input", &x}, {"grad_output", &gy}, {"grad_input", &gx}}));
  RETURN_IF_ERROR(CheckDType(what, "input", x, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "grad_output", gy, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "grad_input", gx, DType::kFloat32));
  RETURN_IF_ERROR(CheckNumel(what, "grad_output", gy, x.numel()));
  RETURN_IF_ERROR(CheckNumel(what, "grad_input", gx, x.numel()));
  const int64_t n = x.numel();
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "GELU backward",
               cuda::GeluBackward(F32(x), F32(gy), MutF32(gx), n));
  }
  const float* in = F32(x);
  const float* g = F32(gy);
  float* out = MutF32(gx);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = k::GeluTanhBackward(in[i], g[i]);
  return absl::OkStatus();
}

absl::Status ReluForward(absl::string_view what, const Tensor& x, const Tensor& y) {
  RETURN_IF_ERROR(CheckDevices(what, {{"input", &x}, {"output", &y}}));
  RETURN_IF_ERROR(CheckDType(what, "input", x, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "output", y, DType::kFloat32));
  RETURN_IF_ERROR(CheckNumel(what, "output", y, x.numel()));
  const int64_t n = x.numel();
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "ReLU forward", cuda::ReluForward(F32(x), MutF32(y), n));
  }
  const float* in = F32(x);
  float* out = MutF32(y);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = k::ReluForward(in[i]);
  return absl::OkStatus();
}

absl::Status ReluBackward(absl::string_view what, const Tensor& y, const Tensor& gy,
                          const Tensor& gx) {
  RETURN_IF_ERROR(CheckDevices(what, {{"output", &y}, {"grad_output", &gy}, {"grad_input", &gx}}));
  RETURN_IF_ERROR(CheckDType(what, "output", y, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "grad_output", gy, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "grad_input", gx, DType::kFloat32));
  RETURN_IF_ERROR(CheckNumel(what, "grad_output", gy, y.numel()));
  RETURN_IF_ERROR(CheckNumel(what, "grad_input", gx, y.numel()));
  const int64_t n = y.numel();
  if (y.device().is_cuda()) {
    NN_ON_CUDA(y.device(), what, "ReLU backward",
               cuda::ReluBackward(F32(y), F32(gy), MutF32(gx), n));
  }
  const float* out = F32(y);
  const float* g = F32(gy);
  float* gi = MutF32(gx);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) gi[i] = k::ReluBackward(out[i], g[i]);
  return absl::OkStatus();
}

absl::Status AddTensors(absl::string_view what, const Tensor& a, const Tensor& b,
                        const Tensor& out) {
  RETURN_IF_ERROR(CheckDevices(what, {{"first operand", &a}, {"second operand", &b},
                                      {"sum", &out}}));
  RETURN_IF_ERROR(CheckDType(what, "first operand", a, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "second operand", b, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "sum", out, DType::kFloat32));
  RETURN_IF_ERROR(CheckNumel(what, "second operand", b, a.numel()));
  RETURN_IF_ERROR(CheckNumel(what, "sum", out, a.numel()));
  const int64_t n = a.numel();
  if (a.device().is_cuda()) {
    NN_ON_CUDA(a.device(), what, "add", cuda::Add(F32(a), F32(b), MutF32(out), n));
  }
  const float* pa = F32(a);
  const float* pb = F32(b);
  float* po = MutF32(out);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) po[i] = k::Add(pa[i], pb[i]);
  return absl::OkStatus();
}

absl::Status BiasAdd(absl::string_view what, const Tensor& x, const Tensor& bias,
                     const Tensor& out) {
  RETURN_IF_ERROR(CheckDevices(what, {{"input", &x}, {"bias", &bias}, {"output", &out}}));
  RETURN_IF_ERROR(CheckDType(what, "input", x, DType::kFloat32));
  RETURN_IF_ERROR(CheckWeightDType(what, "bias", bias));
  RETURN_IF_ERROR(CheckDType(what, "output", out, DType::kFloat32));
  RETURN_IF_ERROR(CheckNumel(what, "output", out, x.numel()));
  const int64_t cols = bias.numel();
  if (cols == 0 || x.numel() % cols != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bias ", bias.ToString(),
                                                   " does not tile input ", x.ToString()));
  }
  const int64_t rows = x.numel() / cols;
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "bias add",
               cuda::BiasAdd(F32(x), bias.raw_data(), IsBf16(bias), MutF32(out), rows, cols));
  }
  const float* in = F32(x);
  float* o = MutF32(out);
  WithWeight(bias, [&](const auto* b) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = in + r * cols;
      float* orow = o + r * cols;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) orow[j] = k::BiasAdd(xr[j], b, j);
    }
  });
  return absl::OkStatus();
}

absl::Status AccumulateColumnSums(absl::string_view what, const Tensor& x, const Tensor& y,
                                  const Tensor& acc) {
  if (y.defined()) {
    RETURN_IF_ERROR(CheckDevices(what, {{"input", &x}, {"second factor", &y}, {"sums", &acc}}));
    RETURN_IF_ERROR(CheckDType(what, "second factor", y, DType::kFloat32));
    RETURN_IF_ERROR(CheckNumel(what, "second factor", y, x.numel()));
  } else {
    RETURN_IF_ERROR(CheckDevices(what, {{"input", &x}, {"sums", &acc}}));
  }
  RETURN_IF_ERROR(CheckDType(what, "input", x, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "sums", acc, DType::kFloat32));
  const int64_t cols = acc.numel();
  if (cols == 0 || x.numel() % cols != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": sums ", acc.ToString(),
                                                   " do not tile input ", x.ToString()));
  }
  const int64_t rows = x.numel() / cols;
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "column sums",
               cuda::ColumnSums(F32(x), y.defined() ? F32(y) : nullptr, MutF32(acc), rows, cols));
  }
  const float* px = F32(x);
  const float* py = y.defined() ? F32(y) : nullptr;
  float* pacc = MutF32(acc);
  std::vector<double> sums(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = px + r * cols;
    if (py != nullptr) {
      const float* yr = py + r * cols;
      for (int64_t j = 0; j < cols; ++j) sums[j] += static_cast<double>(xr[j]) * yr[j];
    } else {
      for (int64_t j = 0; j < cols; ++j) sums[j] += xr[j];
    }
  }
  for (int64_t j = 0; j < cols; ++j) pacc[j] = static_cast<float>(pacc[j] + sums[j]);
  return absl::OkStatus();
}

absl::Status LayerNormForward(absl::string_view what, const Tensor& x, const Tensor& w,
                              const Tensor& b, float eps, const Tensor& y, const Tensor& xhat,
                              const Tensor& rstd) {
  RETURN_IF_ERROR(CheckDevices(what, {{"input", &x}, {"weight", &w}, {"bias", &b}, {"output", &y},
                                      {"normalised input", &xhat}, {"rstd", &rstd}}));
  RETURN_IF_ERROR(CheckDType(what, "input", x, DType::kFloat32));
  RETURN_IF_ERROR(CheckWeightDType(what, "weight", w));
  if (b.dtype() != w.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bias ", b.ToString(),
                                                   " must have the weight's dtype, ",
                                                   core::DTypeName(w.dtype())));
  }
  const int64_t cols = w.numel();
  RETURN_IF_ERROR(CheckNumel(what, "bias", b, cols));
  if (cols == 0 || x.numel() % cols != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": weight ", w.ToString(),
                                                   " does not tile input ", x.ToString()));
  }
  const int64_t rows = x.numel() / cols;
  RETURN_IF_ERROR(CheckDType(what, "output", y, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "normalised input", xhat, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "rstd", rstd, DType::kFloat32));
  RETURN_IF_ERROR(CheckNumel(what, "output", y, x.numel()));
  RETURN_IF_ERROR(CheckNumel(what, "normalised input", xhat, x.numel()));
  RETURN_IF_ERROR(CheckNumel(what, "rstd", rstd, rows));
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "LayerNorm forward",
               cuda::LayerNormForward(F32(x), w.raw_data(), b.raw_data(), IsBf16(w), eps,
                                      MutF32(y), MutF32(xhat), MutF32(rstd), rows, cols));
  }
  const float* px = F32(x);
  float* py = MutF32(y);
  float* ph = MutF32(xhat);
  float* pr = MutF32(rstd);
  WithWeight(w, [&](const auto* wp) {
    using W = std::remove_const_t<std::remove_pointer_t<decltype(wp)>>;
    const W* bp = static_cast<const W*>(b.raw_data());
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = px + r * cols;
      double sum = 0.0;
      for (int64_t j = 0; j < cols; ++j) sum += xr[j];
      const double mean = sum / cols;
      double sq = 0.0;
      for (int64_t j = 0; j < cols; ++j) sq += (xr[j] - mean) * (xr[j] - mean);
      const double inv = k::LayerNormRstd(sq / cols, static_cast<double>(eps));
      pr[r] = static_cast<float>(inv);
      float* hr = ph + r * cols;
      float* yr = py + r * cols;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) {
        yr[j] = k::LayerNormApply(xr[j], mean, inv, wp, bp, j, &hr[j]);
      }
    }
  });
  return absl::OkStatus();
}

absl::Status LayerNormBackward(absl::string_view what, const Tensor& g, const Tensor& xhat,
                               const Tensor& rstd, const Tensor& w, const Tensor& gx,
                               const Tensor& gw, const Tensor& gb) {
  RETURN_IF_ERROR(CheckDevices(what, {{"grad_output", &g}, {"normalised input", &xhat},
                                      {"rstd", &rstd}, {"weight", &w}, {"grad_input", &gx}}));
  RETURN_IF_ERROR(CheckDType(what, "grad_output", g, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "normalised input", xhat, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "rstd", rstd, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "grad_input", gx, DType::kFloat32));
  RETURN_IF_ERROR(CheckWeightDType(what, "weight", w));
  const int64_t cols = w.numel();
  if (cols == 0 || g.numel() % cols != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": weight ", w.ToString(),
                                                   " does not tile grad_output ", g.ToString()));
  }
  const int64_t rows = g.numel() / cols;
  RETURN_IF_ERROR(CheckNumel(what, "normalised input", xhat, g.numel()));
  RETURN_IF_ERROR(CheckNumel(what, "grad_input", gx, g.numel()));
  RETURN_IF_ERROR(CheckNumel(what, "rstd", rstd, rows));
  for (const Arg& a : {Arg{"weight gradient", &gw}, Arg{"bias gradient", &gb}}) {
    if (!a.tensor->defined()) continue;
    RETURN_IF_ERROR(CheckDevices(what, {{"grad_output", &g}, a}));
    RETURN_IF_ERROR(CheckDType(what, a.name, *a.tensor, DType::kFloat32));
    RETURN_IF_ERROR(CheckNumel(what, a.name, *a.tensor, cols));
  }
  if (g.device().is_cuda()) {
#ifdef FSDP_WITH_CUDA
    RETURN_IF_ERROR(UseDevice(g.device(), what));
    RETURN_IF_ERROR(Launched(cuda::LayerNormBackwardInput(F32(g), F32(xhat), F32(rstd),
                                                          w.raw_data(), IsBf16(w), MutF32(gx),
                                                          rows, cols),
                             what, "LayerNorm backward"));
    if (gw.defined()) {
      RETURN_IF_ERROR(Launched(cuda::ColumnSums(F32(g), F32(xhat), MutF32(gw), rows, cols), what,
                               "LayerNorm weight gradient"));
    }
    if (gb.defined()) {
      RETURN_IF_ERROR(Launched(cuda::ColumnSums(F32(g), nullptr, MutF32(gb), rows, cols), what,
                               "LayerNorm bias gradient"));
    }
    return absl::OkStatus();
#else
    return NoCuda(g.device(), what);
#endif
  }
  const float* pg = F32(g);
  const float* ph = F32(xhat);
  const float* pr = F32(rstd);
  float* out = MutF32(gx);
  WithWeight(w, [&](const auto* wp) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* gr = pg + r * cols;
      const float* hr = ph + r * cols;
      double sum_gh = 0.0, sum_gh_h = 0.0;
      for (int64_t j = 0; j < cols; ++j) {
        const double gh = k::LayerNormGradHat<double>(gr[j], wp, j);
        sum_gh += gh;
        sum_gh_h += gh * hr[j];
      }
      const double mean_gh = sum_gh / cols;
      const double mean_gh_h = sum_gh_h / cols;
      const double rs = pr[r];
      float* o = out + r * cols;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) {
        o[j] = k::LayerNormBackwardInput(gr[j], wp, j, hr[j], rs, mean_gh, mean_gh_h);
      }
    }
  });
  if (gw.defined() || gb.defined()) {
    std::vector<double> sw(static_cast<size_t>(cols), 0.0), sb(static_cast<size_t>(cols), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const float* gr = pg + r * cols;
      const float* hr = ph + r * cols;
      for (int64_t j = 0; j < cols; ++j) {
        sw[j] += static_cast<double>(gr[j]) * hr[j];
        sb[j] += gr[j];
      }
    }
    float* pgw = gw.defined() ? MutF32(gw) : nullptr;
    float* pgb = gb.defined() ? MutF32(gb) : nullptr;
    for (int64_t j = 0; j < cols; ++j) {
      if (pgw != nullptr) pgw[j] = static_cast<float>(pgw[j] + sw[j]);
      if (pgb != nullptr) pgb[j] = static_cast<float>(pgb[j] + sb[j]);
    }
  }
  return absl::OkStatus();
}

absl::Status CausalSoftmaxForward(absl::string_view what, const Tensor& scores, int64_t T) {
  RETURN_IF_ERROR(CheckDevices(what, {{"attention scores", &scores}}));
  RETURN_IF_ERROR(CheckDType(what, "attention scores", scores, DType::kFloat32));
  if (T <= 0 || scores.numel() % T != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": attention scores ", scores.ToString(),
                                                   " are not rows of ", T));
  }
  const int64_t rows = scores.numel() / T;
  if (scores.device().is_cuda()) {
    NN_ON_CUDA(scores.device(), what, "causal softmax forward",
               cuda::CausalSoftmaxForward(MutF32(scores), rows, T));
  }
  float* p = MutF32(scores);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % T;
    float* row = p + r * T;
    float max = row[0];
    for (int64_t s = 1; s <= t; ++s) max = std::max(max, row[s]);
    double sum = 0.0;
    for (int64_t s = 0; s <= t; ++s) {
      row[s] = k::SoftmaxExp(row[s], max);
      sum += row[s];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t s = 0; s < T; ++s) {
      row[s] = k::CausalMasked(t, s) ? 0.0f : k::SoftmaxNormalize(row[s], inv);
    }
  }
  return absl::OkStatus();
}

absl::Status CausalSoftmaxBackward(absl::string_view what, const Tensor& p, const Tensor& g,
                                   int64_t T, float scale) {
  RETURN_IF_ERROR(CheckDevices(what, {{"attention probabilities", &p}, {"their gradient", &g}}));
  RETURN_IF_ERROR(CheckDType(what, "attention probabilities", p, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "their gradient", g, DType::kFloat32));
  RETURN_IF_ERROR(CheckNumel(what, "their gradient", g, p.numel()));
  if (T <= 0 || p.numel() % T != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": attention probabilities ",
                                                   p.ToString(), " are not rows of ", T));
  }
  const int64_t rows = p.numel() / T;
  if (p.device().is_cuda()) {
    NN_ON_CUDA(p.device(), what, "causal softmax backward",
               cuda::CausalSoftmaxBackward(F32(p), MutF32(g), rows, T, scale));
  }
  const float* pp = F32(p);
  float* pg = MutF32(g);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % T;
    const float* pr = pp + r * T;
    float* gr = pg + r * T;
    double dot = 0.0;
    for (int64_t s = 0; s <= t; ++s) dot += static_cast<double>(gr[s]) * pr[s];
    for (int64_t s = 0; s < T; ++s) {
      gr[s] = k::CausalMasked(t, s) ? 0.0f : k::SoftmaxBackward(pr[s], gr[s], dot, scale);
    }
  }
  return absl::OkStatus();
}

absl::Status EmbeddingForward(absl::string_view what, const Tensor& table, const Tensor& ids,
                              const Tensor& y) {
  RETURN_IF_ERROR(CheckDevices(what, {{"weight", &table}, {"ids", &ids}, {"output", &y}}));
  RETURN_IF_ERROR(CheckWeightDType(what, "weight", table));
  RETURN_IF_ERROR(CheckDType(what, "ids", ids, DType::kInt32));
  RETURN_IF_ERROR(CheckDType(what, "output", y, DType::kFloat32));
  if (table.dim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": weight must be 2-D [num, dim], got ", table.ToString()));
  }
  const int64_t num = table.size(0), dim = table.size(1), n = ids.numel();
  RETURN_IF_ERROR(CheckNumel(what, "output", y, n * dim));
  if (table.device().is_cuda()) {
    NN_ON_CUDA(table.device(), what, "embedding gather",
               cuda::EmbeddingForward(ids.data<int32_t>(), n, table.raw_data(), IsBf16(table),
                                      num, dim, MutF32(y)));
  }
  const int32_t* id = ids.data<int32_t>();
  float* out = MutF32(y);
  WithWeight(table, [&](const auto* tp) {
    for (int64_t i = 0; i < n; ++i) {
      float* row = out + i * dim;
      if (!k::EmbeddingIdValid(id[i], num)) {
        for (int64_t j = 0; j < dim; ++j) row[j] = 0.0f;
        continue;
      }
      for (int64_t j = 0; j < dim; ++j) row[j] = k::EmbeddingGather(tp, id[i], dim, j);
    }
  });
  return absl::OkStatus();
}

absl::Status EmbeddingBackward(absl::string_view what, const Tensor& ids, const Tensor& g,
                               const Tensor& gw) {
  RETURN_IF_ERROR(CheckDevices(what, {{"weight gradient", &gw}, {"ids", &ids},
                                      {"grad_output", &g}}));
  RETURN_IF_ERROR(CheckDType(what, "ids", ids, DType::kInt32));
  RETURN_IF_ERROR(CheckDType(what, "grad_output", g, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "weight gradient", gw, DType::kFloat32));
  if (gw.dim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": weight gradient must be 2-D [num, dim], got ", gw.ToString()));
  }
  const int64_t num = gw.size(0), dim = gw.size(1), n = ids.numel();
  RETURN_IF_ERROR(CheckNumel(what, "grad_output", g, n * dim));
  if (gw.device().is_cuda()) {
    NN_ON_CUDA(gw.device(), what, "embedding gradient scatter-add",
               cuda::EmbeddingBackward(ids.data<int32_t>(), n, F32(g), num, dim, MutF32(gw)));
  }
  const int32_t* id = ids.data<int32_t>();
  const float* pg = F32(g);
  float* pw = MutF32(gw);
  for (int64_t i = 0; i < n; ++i) {
    if (!k::EmbeddingIdValid(id[i], num)) continue;
    Axpy(dim, 1.0f, pg + i * dim, pw + static_cast<int64_t>(id[i]) * dim);
  }
  return absl::OkStatus();
}

absl::StatusOr<double> CrossEntropyForwardBackward(absl::string_view what, const Tensor& logits,
                                                   const Tensor& targets, const Tensor& grad) {
  RETURN_IF_ERROR(CheckDevices(what, {{"logits", &logits}, {"targets", &targets},
                                      {"gradient", &grad}}));
  RETURN_IF_ERROR(CheckDType(what, "logits", logits, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "targets", targets, DType::kInt32));
  RETURN_IF_ERROR(CheckDType(what, "gradient", grad, DType::kFloat32));
  RETURN_IF_ERROR(CheckNumel(what, "gradient", grad, logits.numel()));
  const int64_t n = targets.numel();
  if (n == 0 || logits.numel() % n != 0 || logits.numel() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": logits ", logits.ToString(),
                                                   " are not rows for targets ",
                                                   targets.ToString()));
  }
  const int64_t V = logits.numel() / n;
  const double inv_n = 1.0 / static_cast<double>(n);
  if (logits.device().is_cuda()) {
#ifdef FSDP_WITH_CUDA
    RETURN_IF_ERROR(UseDevice(logits.device(), what));
    // Per-row losses as doubles (8 bytes = 2 int32 elements each).
    ASSIGN_OR_RETURN(Tensor row_loss, Tensor::Allocate({2 * n}, DType::kInt32,
                                                       core::MemoryTag::kActivation,
                                                       logits.device()));
    RETURN_IF_ERROR(Launched(
        cuda::CrossEntropy(F32(logits), targets.data<int32_t>(), n, V, inv_n, MutF32(grad),
                           static_cast<double*>(row_loss.raw_data())),
        what, "cross-entropy"));
    std::vector<double> host(static_cast<size_t>(n));
    RETURN_IF_ERROR(Launched(cudaMemcpy(host.data(), row_loss.raw_data(),
                                        sizeof(double) * static_cast<size_t>(n),
                                        cudaMemcpyDeviceToHost),
                             what, "copy of the cross-entropy row losses to the host"));
    double total = 0.0;
    for (double v : host) total += v;
    return total * inv_n;
#else
    return NoCuda(logits.device(), what);
#endif
  }
  const int32_t* tg = targets.data<int32_t>();
  const float* px = F32(logits);
  float* pg = MutF32(grad);
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = px + i * V;
    float* grow = pg + i * V;
    const double max = *std::max_element(row, row + V);
    double sum = 0.0;
    for (int64_t j = 0; j < V; ++j) sum += k::CrossEntropyExp(row[j], max);
    const double log_sum = k::Log(sum);
    total += k::CrossEntropyRowLoss(sum, max, row[tg[i]]);
    for (int64_t j = 0; j < V; ++j) {
      grow[j] = k::CrossEntropyGrad(row[j], max, log_sum, j == tg[i], inv_n);
    }
  }
  return total * inv_n;
}

absl::Status ZeroTensor(absl::string_view what, const Tensor& t) {
  if (!t.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": zeroing an undefined tensor"));
  }
  if (t.numel() == 0) return absl::OkStatus();
  if (t.device().is_cuda()) {
    NN_ON_CUDA(t.device(), what, "memset",
               cudaMemsetAsync(t.raw_data(), 0, static_cast<size_t>(t.nbytes()), 0));
  }
  std::memset(t.raw_data(), 0, static_cast<size_t>(t.nbytes()));
  return absl::OkStatus();
}

}  // namespace nn
