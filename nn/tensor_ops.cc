#include "nn/tensor_ops.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/internal/op_checks.h"
#include "nn/kernels/elementwise.h"
#include "nn/kernels/math.h"
#include "nn/kernels/rowwise.h"
#include "nn/ops.h"

#ifdef FSDP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "nn/cuda/kernels.h"
#endif

namespace nn {
namespace {

namespace k = ::nn::kernels;
using core::DType;
using core::Tensor;
using internal::Arg;
using internal::CheckDevices;
using internal::CheckElementwiseF32;
using internal::CheckDType;
using internal::CheckNumel;
using internal::CheckWeightDType;
using internal::F32;
using internal::IsBf16;
using internal::MutF32;
using internal::WithWeight;
#ifdef FSDP_WITH_CUDA
using internal::Launched;
using internal::UseDevice;
#else
using internal::NoCuda;
#endif

}  // namespace

absl::Status GeluForward(absl::string_view what, const Tensor& x, const Tensor& y) {
  RETURN_IF_ERROR(CheckElementwiseF32(what, {{"input", &x}, {"output", &y}}));
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
  RETURN_IF_ERROR(CheckElementwiseF32(
      what, {{"input", &x}, {"grad_output", &gy}, {"grad_input", &gx}}));
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
  RETURN_IF_ERROR(CheckElementwiseF32(what, {{"input", &x}, {"output", &y}}));
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
  RETURN_IF_ERROR(CheckElementwiseF32(
      what, {{"output", &y}, {"grad_output", &gy}, {"grad_input", &gx}}));
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
  RETURN_IF_ERROR(CheckElementwiseF32(
      what, {{"first operand", &a}, {"second operand", &b}, {"sum", &out}}));
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
