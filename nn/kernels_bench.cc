// Microbenchmark of the CPU element and row kernels behind nn/tensor_ops.h: for each
// kernel, elements per second of the previous scalar loops ("before": the loops as they
// were before FSDP_CPU_CLONES, with double row reductions and libm exp, compiled for
// baseline x86-64 with -fopenmp-simd, reproduced below) and of the CPU launchers
// (kernels/cpu/kernels.h, "after"), at the sizes of the GPT config 512 128 256 6 8 8
// (V T C L H B), timed by kernels/testing/bench.h (thread CPU time on 1 thread, then wall
// time on 1 and 2 OpenMP threads). The "fused_*" entries compare the fused launchers
// (NOTE [Fused ops], nn/tensor_ops.h), as "after", with the two launchers they replace run
// one after the other, as "before". The optimizer update is benchmarked by
// //kernels:kernels_bench. Prints one JSON object.
//
//   bazel run -c opt //nn:kernels_bench
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/kernels.h"
#include "kernels/elementwise.h"
#include "kernels/rowwise.h"
#include "kernels/testing/bench.h"

namespace {

namespace k = ::kernels;
namespace kcpu = ::kernels::cpu;
using ::kernels::bench::Measure;
using ::kernels::bench::Normal;
using ::kernels::bench::P;
using ::kernels::bench::Result;
using ::kernels::bench::Time;
using ::kernels::bench::WallTime;

// ---- The loops before this change (scalar reductions in double, libm exp).

void OldGeluForward(const float* in, float* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = k::GeluTanhForward(in[i]);
}

void OldGeluBackward(const float* in, const float* g, float* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = k::GeluTanhBackward(in[i], g[i]);
}

void OldAdd(const float* a, const float* b, float* o, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) o[i] = k::Add(a[i], b[i]);
}

void OldBiasAdd(const float* in, const float* b, float* o, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = in + r * cols;
    float* orow = o + r * cols;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) orow[j] = k::BiasAdd(xr[j], b, j);
  }
}

void OldColumnSums(const float* px, const float* py, float* pacc, int64_t rows, int64_t cols) {
  std::vector<double> sums(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = px + r * cols;
    const float* yr = py + r * cols;
    for (int64_t j = 0; j < cols; ++j) sums[j] += static_cast<double>(xr[j]) * yr[j];
  }
  for (int64_t j = 0; j < cols; ++j) pacc[j] = static_cast<float>(pacc[j] + sums[j]);
}

void OldLayerNorm(const float* px, const float* wp, const float* bp, float eps, float* py,
                  float* ph, float* pr, int64_t rows, int64_t cols) {
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
      hr[j] = k::LayerNormHat(xr[j], mean, inv);
      yr[j] = k::LayerNormApply(xr[j], mean, inv, wp, bp, j);
    }
  }
}

void OldLayerNormBackward(const float* pg, const float* ph, const float* pr, const float* wp,
                          float* out, float* pgw, float* pgb, int64_t rows, int64_t cols) {
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
  std::vector<double> sw(static_cast<size_t>(cols), 0.0), sb(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* gr = pg + r * cols;
    const float* hr = ph + r * cols;
    for (int64_t j = 0; j < cols; ++j) {
      sw[j] += static_cast<double>(gr[j]) * hr[j];
      sb[j] += gr[j];
    }
  }
  for (int64_t j = 0; j < cols; ++j) {
    pgw[j] = static_cast<float>(pgw[j] + sw[j]);
    pgb[j] = static_cast<float>(pgb[j] + sb[j]);
  }
}

void OldSoftmax(float* p, int64_t rows, int64_t T) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % T;
    float* row = p + r * T;
    float max = row[0];
    for (int64_t s = 1; s <= t; ++s) max = std::max(max, row[s]);
    double sum = 0.0;
    for (int64_t s = 0; s <= t; ++s) {
      row[s] = expf(row[s] - max);
      sum += row[s];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t s = 0; s < T; ++s) {
      row[s] = k::CausalMasked(t, s) ? 0.0f : k::SoftmaxNormalize(row[s], inv);
    }
  }
}

void OldSoftmaxBackward(const float* pp, float* pg, int64_t rows, int64_t T, float scale) {
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
}

double OldCrossEntropy(const float* px, const int32_t* tg, float* pg, int64_t n, int64_t V) {
  const double inv_n = 1.0 / n;
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = px + i * V;
    float* grow = pg + i * V;
    const double max = *std::max_element(row, row + V);
    double sum = 0.0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(static_cast<double>(row[j]) - max);
    const double log_sum = std::log(sum);
    total += log_sum + max - row[tg[i]];
    for (int64_t j = 0; j < V; ++j) {
      const double p = std::exp(static_cast<double>(row[j]) - max - log_sum);
      grow[j] = static_cast<float>((p - (j == tg[i] ? 1.0 : 0.0)) * inv_n);
    }
  }
  return total * inv_n;
}

// The sizes of the GPT config 512 128 256 6 8 8 (V T C L H B).
constexpr int64_t kBatch = 8, kSeqLen = 128, kEmbd = 256, kHeads = 8, kVocab = 512;
constexpr int64_t kRows = kBatch * kSeqLen, kHidden = 4 * kEmbd;

// GELU, bias add and bias gradient over the MLP's hidden activations.
void MeasureMlp(std::vector<Result>* results) {
  const int64_t rows = kRows, hidden = kHidden;
  const int64_t n = rows * hidden;
  core::Tensor x = Normal(n, 1, 2.0f), g = Normal(n, 2), y = core::Tensor::Empty({n});
  results->push_back(Measure(
      "gelu_forward", n, [&] { OldGeluForward(P(x), P(y), n); },
      [&] { kcpu::GeluForward(P(x), P(y), n); }));
  results->push_back(Measure(
      "gelu_backward", n, [&] { OldGeluBackward(P(x), P(g), P(y), n); },
      [&] { kcpu::GeluBackward(P(x), P(g), P(y), n); }));
  core::Tensor bias = Normal(hidden, 3);
  results->push_back(Measure(
      "bias_add", n, [&] { OldBiasAdd(P(x), P(bias), P(y), rows, hidden); },
      [&] { kcpu::BiasAdd(P(x), P(bias), false, P(y), rows, hidden); }));
  core::Tensor acc = core::Tensor::Zeros({hidden});
  results->push_back(Measure(
      "column_sums", n, [&] { OldColumnSums(P(x), P(g), P(acc), rows, hidden); },
      [&] { kcpu::ColumnSums(P(x), P(g), P(acc), rows, hidden); }));
}

// Residual add and LayerNorm over [rows, C].
void MeasureResidualLayerNorm(std::vector<Result>* results) {
  const int64_t rows = kRows, C = kEmbd;
  const int64_t n = rows * C;
  core::Tensor x = Normal(n, 4), g = Normal(n, 5), y = core::Tensor::Empty({n});
  core::Tensor h = core::Tensor::Empty({n}), gx = core::Tensor::Empty({n});
  core::Tensor mean = core::Tensor::Empty({rows}), rstd = core::Tensor::Empty({rows});
  core::Tensor w = Normal(C, 6), b = Normal(C, 7);
  core::Tensor gw = core::Tensor::Zeros({C}), gb = core::Tensor::Zeros({C});
  results->push_back(Measure(
      "residual_add", n, [&] { OldAdd(P(x), P(g), P(y), n); },
      [&] { kcpu::Add(P(x), P(g), P(y), n); }));
  results->push_back(Measure(
      "layer_norm_forward", n,
      [&] { OldLayerNorm(P(x), P(w), P(b), 1e-5f, P(y), P(h), P(rstd), rows, C); },
      [&] {
        kcpu::LayerNormForward(P(x), P(w), P(b), false, 1e-5f, P(y), P(mean), P(rstd), rows, C);
      }));
  results->push_back(Measure(
      "layer_norm_backward", n,
      [&] { OldLayerNormBackward(P(g), P(h), P(rstd), P(w), P(gx), P(gw), P(gb), rows, C); },
      [&] {
        kcpu::NormParamGrads(P(g), P(x), P(mean), P(rstd), P(gw), P(gb), rows, C);
        kcpu::LayerNormBackwardInput(P(g), P(x), P(mean), P(rstd), P(w), false, P(gx), rows, C);
      }));
}

// The fused ops against the two ops each replaces, at the residual's size.
void MeasureFused(std::vector<Result>* results) {
  const int64_t rows = kRows, C = kEmbd;
  const int64_t m = rows * C;
  core::Tensor a = Normal(m, 16), b = Normal(m, 17), h = core::Tensor::Empty({m});
  core::Tensor ln = core::Tensor::Empty({m});
  core::Tensor gx = core::Tensor::Empty({m}), rstd = core::Tensor::Empty({rows});
  core::Tensor mean = core::Tensor::Empty({rows});
  core::Tensor w = Normal(C, 18), lb = Normal(C, 19);
  core::Tensor gw = core::Tensor::Zeros({C}), glb = core::Tensor::Zeros({C});
  results->push_back(Measure(
      "fused_residual_layer_norm_forward", m,
      [&] {
        kcpu::Add(P(a), P(b), P(h), m);
        kcpu::LayerNormForward(P(h), P(w), P(lb), false, 1e-5f, P(ln), P(mean), P(rstd), rows, C);
      },
      [&] {
        kcpu::AddLayerNormForward(P(a), P(b), P(h), P(w), P(lb), false, 1e-5f, P(ln), P(mean),
                                  P(rstd), rows, C);
      }));
  results->push_back(Measure(
      "fused_layer_norm_backward_residual", m,
      [&] {
        kcpu::NormParamGrads(P(b), P(h), P(mean), P(rstd), P(gw), P(glb), rows, C);
        kcpu::LayerNormBackwardInput(P(b), P(h), P(mean), P(rstd), P(w), false, P(gx), rows, C);
        kcpu::Add(P(a), P(gx), P(gx), m);
      },
      [&] {
        kcpu::NormParamGrads(P(b), P(h), P(mean), P(rstd), P(gw), P(glb), rows, C);
        kcpu::LayerNormBackwardInputAdd(P(b), P(h), P(mean), P(rstd), P(w), false, P(a), P(gx),
                                        rows, C);
      }));
}

// Causal softmax over [B, H, T, T]. Each call overwrites its input, so every timed call
// first restores it; the copy's own time is subtracted.
void MeasureCausalSoftmax(std::vector<Result>* results) {
  const int64_t T = kSeqLen;
  const int64_t srows = kBatch * kHeads * T, n = srows * T;
  core::Tensor s0 = Normal(n, 8, 3.0f), s = core::Tensor::Empty({n});
  core::Tensor g0 = Normal(n, 9), g = core::Tensor::Empty({n});
  auto refresh = [&] { std::copy(P(s0), P(s0) + n, P(s)); };
  results->push_back(Measure(
      "causal_softmax_forward", n,
      [&] {
        refresh();
        OldSoftmax(P(s), srows, T);
      },
      [&] {
        refresh();
        kcpu::CausalSoftmaxForward(P(s), srows, T);
      },
      Time(refresh), WallTime(1, refresh)));
  auto refresh_g = [&] { std::copy(P(g0), P(g0) + n, P(g)); };
  results->push_back(Measure(
      "causal_softmax_backward", n,
      [&] {
        refresh_g();
        OldSoftmaxBackward(P(s), P(g), srows, T, 0.125f);
      },
      [&] {
        refresh_g();
        kcpu::CausalSoftmaxBackward(P(s), false, P(g), srows, T, 0.125f);
      },
      Time(refresh_g), WallTime(1, refresh_g)));
}

// Cross-entropy over [rows, V].
void MeasureCrossEntropy(std::vector<Result>* results) {
  const int64_t rows = kRows, V = kVocab;
  const int64_t n = rows * V;
  volatile double sink = 0;  // keeps the losses observable
  core::Tensor logits = Normal(n, 10, 2.0f), grad = core::Tensor::Empty({n});
  std::vector<int32_t> tg(rows);
  for (int64_t i = 0; i < rows; ++i) tg[i] = static_cast<int32_t>((i * 37) % V);
  std::vector<double> row_loss(static_cast<size_t>(rows));
  results->push_back(Measure(
      "cross_entropy", n,
      [&] { sink = sink + OldCrossEntropy(P(logits), tg.data(), P(grad), rows, V); },
      [&] {
        kcpu::CrossEntropy(P(logits), tg.data(), rows, V, 1.0 / rows, P(grad), row_loss.data());
        double total = 0.0;
        for (double l : row_loss) total += l;
        sink = sink + total / rows;
      }));
}

}  // namespace

int main() {
  std::vector<Result> results;
  MeasureMlp(&results);
  MeasureResidualLayerNorm(&results);
  MeasureFused(&results);
  MeasureCausalSoftmax(&results);
  MeasureCrossEntropy(&results);
  kernels::bench::PrintJson(results);
  return 0;
}
