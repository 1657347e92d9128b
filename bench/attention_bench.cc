// attention_bench: the fused causal attention kernels (kernels/cuda/flash_attention.h),
// each block shape timed on its own, then the shapes the tuner picks. JSON on stdout;
// bench/attention_torch.py times PyTorch's SDPA on the same problem with the same FLOPs.
//
//   bazel run --config=cuda -c opt //bench:attention_bench
//   bazel run --config=cuda -c opt //bench:attention_bench -- --batch=4 --seq_len=2048
//
// Inputs: qkv [B, T, 3C] and gy [B, T, C] hold bf16 normal(0, 1) values from a fixed seed
// (the same bits on every machine), scale = 1/sqrt(head_dim).
//   forward: each forward shape i (NOTE [Flash block shapes]) pinned: --warmup untimed
//     launches, then --reps launches, each between two CUDA events; the median and the least
//     of those times; y and lse compared byte for byte with shape 0's.
//   backward: on shape 0's forward outputs, each (dK/dV shape, dQ shape) pair pinned, timed
//     the same way; gqkv compared with pair (0, 0)'s.
//   tuned: the first unpinned forward and backward (each tunes, and synchronises), timed on
//     the host as tuning_ms; then --reps unpinned launches of each, their outputs compared
//     with the references too, and FlashTuningReport.
// Before each entry its outputs are filled with 0xff bytes (NaN in bf16 and fp32), so an
// element a shape leaves unwritten cannot match the reference.
//
// FLOPs, with P = T (T + 1) / 2 causal (query, key) pairs per head and BH = B H:
//   model: forward 4 BH P hd (S = QK^T and PV), backward 10 BH P hd (S again, dP, dV, dK,
//     dQ); "tflops" = model FLOPs / median time, bench/attention_torch.py's definition.
//   executed by our kernels: every entry of the 64 x 64 tiles on or below the diagonal,
//     E = 64^2 nt (nt + 1) / 2 with nt = ceil(T / 64): forward 4 BH E hd, backward
//     14 BH E hd (S and dP are computed twice, for dK/dV and for dQ: 7 products).
//
// Output: one JSON line, the last on stdout: {"attention_bench":1, "ok", "error", "shape",
// "flops", "device", "forward": [...], "backward": [...], "tuned": {...}}; progress goes to
// stderr. `ok` is true when every entry ran and had its reference's bits; otherwise "error"
// lists what did not. An error of one entry's launches is that entry's "error" and the
// bench goes on; an error that leaves the device unusable (an illegal address) ends it.
// Exit status: 0 when ok; 1 otherwise; 2 for bad flags and for a build without CUDA.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/flag_checks.h"
#include "core/status_macros.h"
#include "kernels/rowwise.h"
#include "nlohmann/json.hpp"

#ifdef FSDP_WITH_CUDA
#include <cuda_runtime_api.h>

#include <memory>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/string_view.h"
#include "core/bf16_hd.h"
#include "core/cuda_device.h"
#include "core/cuda_status.h"
#include "core/device.h"
#include "core/random.h"
#include "kernels/cuda/flash_attention.h"
#endif

ABSL_FLAG(int64_t, batch, 16, "sequences (B)");
ABSL_FLAG(int64_t, seq_len, 1024, "tokens per sequence (T)");
ABSL_FLAG(int64_t, n_head, 12, "heads (H)");
ABSL_FLAG(int64_t, head_dim, 64, "head width (C = n_head * head_dim)");
ABSL_FLAG(int, reps, 20, "timed launches per entry (>= 1)");
ABSL_FLAG(int, warmup, 3, "untimed launches before them (>= 0)");
ABSL_FLAG(bool, out_bf16, true, "y and gqkv in bf16 (false: fp32)");

namespace {

using Json = nlohmann::ordered_json;

struct Options {
  int64_t batch = 16;
  int64_t seq_len = 1024;
  int64_t n_head = 12;
  int64_t head_dim = 64;
  int reps = 20;
  int warmup = 3;
  bool out_bf16 = true;
};

absl::StatusOr<Options> ParseFlags() {
  Options o;
  o.batch = absl::GetFlag(FLAGS_batch);
  o.seq_len = absl::GetFlag(FLAGS_seq_len);
  o.n_head = absl::GetFlag(FLAGS_n_head);
  o.head_dim = absl::GetFlag(FLAGS_head_dim);
  o.reps = absl::GetFlag(FLAGS_reps);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.out_bf16 = absl::GetFlag(FLAGS_out_bf16);
  RETURN_IF_ERROR(bench::FlagsAtLeast("attention_bench", {{"batch", o.batch, 1},
                                                          {"seq_len", o.seq_len, 1},
                                                          {"n_head", o.n_head, 1},
                                                          {"head_dim", o.head_dim, 1},
                                                          {"reps", o.reps, 1},
                                                          {"warmup", o.warmup, 0}}));
  if (!kernels::FlashAttentionSupports(o.head_dim)) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention_bench: --head_dim=", o.head_dim,
                     " has no fused kernel (kernels::FlashAttentionSupports)"));
  }
  return o;
}

// FLOPs of one forward and one backward over the whole batch (the file's header).
struct Flops {
  double forward_model = 0;
  double backward_model = 0;
  double forward_executed = 0;
  double backward_executed = 0;
};

Flops CountFlops(const Options& o) {
  const double bh = static_cast<double>(o.batch) * o.n_head;
  const double hd = static_cast<double>(o.head_dim);
  const double pairs = static_cast<double>(o.seq_len) * (o.seq_len + 1) / 2;
  const double nt =
      static_cast<double>((o.seq_len + kernels::kFlashTile - 1) / kernels::kFlashTile);
  const double entries =
      static_cast<double>(kernels::kFlashTile * kernels::kFlashTile) * nt * (nt + 1) / 2;
  return {4 * bh * pairs * hd, 10 * bh * pairs * hd, 4 * bh * entries * hd, 14 * bh * entries * hd};
}

// The fields every output line has, whatever happens after: the problem and its FLOPs.
Json Skeleton(const Options& o) {
  const Flops f = CountFlops(o);
  Json out;
  out["attention_bench"] = 1;
  out["ok"] = false;
  out["error"] = nullptr;
  out["shape"] = Json::object();
  out["shape"]["B"] = o.batch;
  out["shape"]["T"] = o.seq_len;
  out["shape"]["H"] = o.n_head;
  out["shape"]["head_dim"] = o.head_dim;
  out["shape"]["out_bf16"] = o.out_bf16;
  out["shape"]["reps"] = o.reps;
  out["shape"]["warmup"] = o.warmup;
  out["flops"] = {{"forward_model", f.forward_model},
                  {"backward_model", f.backward_model},
                  {"forward_executed", f.forward_executed},
                  {"backward_executed", f.backward_executed}};
  return out;
}

void Print(const Json& out) {
  std::printf("%s\n", out.dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
  std::fflush(stdout);
}

#ifdef FSDP_WITH_CUDA

using core::cuda::StatusFromCuda;
using kernels::cuda::FlashKernel;
using kernels::cuda::FlashShapes;

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DevicePtr = std::unique_ptr<void, CudaFree>;

absl::StatusOr<DevicePtr> Malloc(size_t bytes, absl::string_view what) {
  void* p = nullptr;
  RETURN_IF_ERROR(StatusFromCuda(cudaMalloc(&p, bytes),
                                 absl::StrCat("cudaMalloc of ", what, " (", bytes, " bytes)")));
  return DevicePtr(p);
}

// A device range an entry writes: filled with 0xff before it runs, read back after.
struct Output {
  void* data;
  size_t bytes;
};

// The problem's device buffers (the layouts of kernels/cuda/flash_attention.h).
struct Problem {
  Options o;
  float scale = 1;
  size_t y_bytes = 0, lse_bytes = 0, gqkv_bytes = 0;
  DevicePtr qkv, y, gy, lse, delta, gqkv;

  cudaError_t Forward(const FlashShapes& shapes) const {
    return kernels::cuda::FlashAttentionForward(static_cast<const uint16_t*>(qkv.get()), y.get(),
                                                o.out_bf16, static_cast<float*>(lse.get()), o.batch,
                                                o.seq_len, o.n_head, o.head_dim, scale, shapes);
  }
  cudaError_t Backward(const FlashShapes& shapes) const {
    return kernels::cuda::FlashAttentionBackward(
        static_cast<const uint16_t*>(qkv.get()), y.get(), o.out_bf16,
        static_cast<const uint16_t*>(gy.get()), static_cast<const float*>(lse.get()),
        static_cast<float*>(delta.get()), gqkv.get(), o.out_bf16, o.batch, o.seq_len, o.n_head,
        o.head_dim, scale, shapes);
  }
  std::vector<Output> ForwardOutputs() const {
    return {{y.get(), y_bytes}, {lse.get(), lse_bytes}};
  }
  std::vector<Output> BackwardOutputs() const { return {{gqkv.get(), gqkv_bytes}}; }
};

// `count` bf16 normal(0, 1) values of stream `stream` of a fixed seed, copied to `dst`.
absl::Status FillNormal(void* dst, size_t count, uint64_t stream, absl::string_view what) {
  core::Rng rng = core::Rng(20240917).Fork(stream);
  std::vector<uint16_t> host(count);
  for (uint16_t& v : host) v = core::FloatToBf16Bits(rng.Normal(0.0f, 1.0f));
  return StatusFromCuda(cudaMemcpy(dst, host.data(), count * 2, cudaMemcpyHostToDevice),
                        absl::StrCat("copying ", what, " to the device"));
}

absl::StatusOr<Problem> MakeProblem(const Options& o) {
  Problem p;
  p.o = o;
  p.scale = 1.0f / std::sqrt(static_cast<float>(o.head_dim));
  const size_t rows = static_cast<size_t>(o.batch * o.seq_len);
  const size_t c = static_cast<size_t>(o.n_head * o.head_dim);
  const size_t out_width = o.out_bf16 ? 2 : 4;
  p.y_bytes = rows * c * out_width;
  p.lse_bytes = static_cast<size_t>(o.batch * o.n_head * o.seq_len) * 4;
  p.gqkv_bytes = rows * 3 * c * out_width;
  ASSIGN_OR_RETURN(p.qkv, Malloc(rows * 3 * c * 2, "qkv"));
  ASSIGN_OR_RETURN(p.y, Malloc(p.y_bytes, "y"));
  ASSIGN_OR_RETURN(p.gy, Malloc(rows * c * 2, "gy"));
  ASSIGN_OR_RETURN(p.lse, Malloc(p.lse_bytes, "lse"));
  ASSIGN_OR_RETURN(p.delta, Malloc(p.lse_bytes, "delta"));
  ASSIGN_OR_RETURN(p.gqkv, Malloc(p.gqkv_bytes, "gqkv"));
  RETURN_IF_ERROR(FillNormal(p.qkv.get(), rows * 3 * c, 0, "qkv"));
  RETURN_IF_ERROR(FillNormal(p.gy.get(), rows * c, 1, "gy"));
  return p;
}

// OK while the device still runs work after an entry's error (a launch refused, now
// cleared); otherwise the error that stays (an illegal address), which ends the bench.
absl::Status DeviceUsable() {
  (void)cudaGetLastError();
  return StatusFromCuda(cudaDeviceSynchronize(), "the device after an entry's error");
}

// What one entry measured: launch times and its outputs' bytes.
struct Measured {
  double median_ms = 0;
  double min_ms = 0;
  std::vector<uint8_t> outputs;
};

// Fills `outputs` with 0xff, runs `launch` `warmup` times untimed, then `reps` times, each
// between two events on the compute stream, and reads `outputs` back. The first error of a
// launch, an event or a copy.
template <typename Launch>
absl::StatusOr<Measured> Measure(int warmup, int reps, const std::vector<Output>& outputs,
                                 Launch launch) {
  for (const Output& out : outputs) {
    RETURN_IF_ERROR(
        StatusFromCuda(cudaMemset(out.data, 0xff, out.bytes), "cudaMemset of an output"));
  }
  for (int i = 0; i < warmup; ++i) RETURN_IF_ERROR(StatusFromCuda(launch(), "a warm-up launch"));
  std::vector<cudaEvent_t> events;
  absl::Cleanup destroy = [&events] {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  };
  for (int i = 0; i < 2 * reps; ++i) {
    cudaEvent_t e;
    RETURN_IF_ERROR(StatusFromCuda(cudaEventCreate(&e), "cudaEventCreate"));
    events.push_back(e);
  }
  const cudaStream_t stream = core::cuda::ComputeStream();
  for (int i = 0; i < reps; ++i) {
    RETURN_IF_ERROR(StatusFromCuda(cudaEventRecord(events[2 * i], stream), "cudaEventRecord"));
    RETURN_IF_ERROR(StatusFromCuda(launch(), "a timed launch"));
    RETURN_IF_ERROR(StatusFromCuda(cudaEventRecord(events[2 * i + 1], stream), "cudaEventRecord"));
  }
  RETURN_IF_ERROR(StatusFromCuda(cudaEventSynchronize(events.back()), "the timed launches"));
  std::vector<double> ms(reps);
  for (int i = 0; i < reps; ++i) {
    float t = 0;
    RETURN_IF_ERROR(StatusFromCuda(cudaEventElapsedTime(&t, events[2 * i], events[2 * i + 1]),
                                   "cudaEventElapsedTime"));
    ms[i] = t;
  }
  std::sort(ms.begin(), ms.end());
  Measured m;
  m.median_ms = reps % 2 == 1 ? ms[reps / 2] : (ms[reps / 2 - 1] + ms[reps / 2]) / 2;
  m.min_ms = ms.front();
  size_t total = 0;
  for (const Output& out : outputs) total += out.bytes;
  m.outputs.resize(total);
  size_t at = 0;
  for (const Output& out : outputs) {
    RETURN_IF_ERROR(StatusFromCuda(
        cudaMemcpy(m.outputs.data() + at, out.data, out.bytes, cudaMemcpyDeviceToHost),
        "copying the outputs to the host"));
    at += out.bytes;
  }
  return m;
}

// What went wrong, in the order met (the output's "error"); each also goes to stderr.
class Problems {
 public:
  // Records `where`'s error; returns the error that ends the bench when the device no
  // longer runs work (DeviceUsable).
  absl::Status Error(absl::string_view where, const absl::Status& error) {
    Add(absl::StrCat(where, ": ", error.ToString()));
    return DeviceUsable();
  }
  // Records outputs of `where` that differ from their reference's.
  void Differs(absl::string_view where) {
    Add(absl::StrCat(where, ": bits differ from the reference"));
  }
  void Add(std::string problem) {
    std::fprintf(stderr, "attention_bench: %s\n", problem.c_str());
    list_.push_back(std::move(problem));
  }
  bool empty() const { return list_.empty(); }
  std::string Joined() const { return absl::StrJoin(list_, "; "); }

 private:
  std::vector<std::string> list_;
};

// The entries of one kernel (forward, backward), each compared with the first one's bits.
class Sweep {
 public:
  Sweep(std::string kind, double model_flops, double executed_flops, Problems* problems)
      : kind_(std::move(kind)),
        model_flops_(model_flops),
        executed_flops_(executed_flops),
        problems_(problems) {}

  // Adds what `m` measured to `row` ("<kind> <label>" names it in errors and on stderr);
  // the first entry is the reference, even when it failed (then nothing is compared).
  // Returns the error that ends the bench, if any.
  absl::Status Add(absl::string_view label, absl::StatusOr<Measured> m, Json& row) {
    const std::string where = absl::StrCat(kind_, " ", label);
    const bool first = first_;
    first_ = false;
    if (!m.ok()) {
      for (const char* key : {"median_ms", "min_ms", "tflops", "tflops_executed", "same_bits"}) {
        row[key] = nullptr;
      }
      row["error"] = m.status().ToString();
      return problems_->Error(where, m.status());
    }
    const double tflops = model_flops_ / (m->median_ms * 1e-3) / 1e12;
    row["median_ms"] = m->median_ms;
    row["min_ms"] = m->min_ms;
    row["tflops"] = tflops;
    row["tflops_executed"] = executed_flops_ / (m->median_ms * 1e-3) / 1e12;
    if (first) reference_ = std::move(m->outputs);
    const std::optional<bool> same = first ? std::optional<bool>(true) : SameAsReference(*m);
    row["same_bits"] = same ? Json(*same) : Json(nullptr);
    row["error"] = nullptr;
    std::fprintf(stderr, "attention_bench: %s: median %.4f ms, min %.4f ms, %.1f TFLOP/s\n",
                 where.c_str(), m->median_ms, m->min_ms, tflops);
    if (same.has_value() && !*same) problems_->Differs(where);
    return absl::OkStatus();
  }

  // Whether `m`'s outputs have the reference's bits (nullopt without a reference).
  std::optional<bool> SameAsReference(const Measured& m) const {
    if (!reference_) return std::nullopt;
    return *reference_ == m.outputs;
  }

 private:
  std::string kind_;
  double model_flops_, executed_flops_;
  Problems* problems_;
  bool first_ = true;
  std::optional<std::vector<uint8_t>> reference_;
};

// Milliseconds of one call on the host clock, with the device idle before and after it.
template <typename Call>
absl::StatusOr<double> HostMs(absl::string_view what, Call call) {
  RETURN_IF_ERROR(StatusFromCuda(cudaDeviceSynchronize(), what));
  const auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(StatusFromCuda(call(), what));
  RETURN_IF_ERROR(StatusFromCuda(cudaDeviceSynchronize(), what));
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The tuned calls of one kernel ("forward" or "backward"): the first one, which tunes,
// timed on the host into tuned["tuning_ms"][kind]; then --reps more like a pinned entry,
// into tuned["<kind>_ms"] and the like, compared with `sweep`'s reference.
template <typename Launch>
absl::Status AddTuned(const std::string& kind, const Options& o, const std::vector<Output>& outputs,
                      Launch launch, double model_flops, const Sweep& sweep, Problems* problems,
                      Json& tuned) {
  const std::string where = "tuned " + kind;
  tuned["tuning_ms"][kind] = nullptr;
  for (const char* suffix : {"_ms", "_min_ms", "_tflops", "_same_bits"}) {
    tuned[kind + suffix] = nullptr;
  }
  absl::StatusOr<double> tuning_ms = HostMs("the call that tunes", launch);
  if (!tuning_ms.ok()) return problems->Error(where, tuning_ms.status());
  tuned["tuning_ms"][kind] = *tuning_ms;
  absl::StatusOr<Measured> m = Measure(o.warmup, o.reps, outputs, launch);
  if (!m.ok()) return problems->Error(where, m.status());
  const double tflops = model_flops / (m->median_ms * 1e-3) / 1e12;
  const std::optional<bool> same = sweep.SameAsReference(*m);
  tuned[kind + "_ms"] = m->median_ms;
  tuned[kind + "_min_ms"] = m->min_ms;
  tuned[kind + "_tflops"] = tflops;
  tuned[kind + "_same_bits"] = same ? Json(*same) : Json(nullptr);
  std::fprintf(stderr,
               "attention_bench: %s: tuning %.1f ms; median %.4f ms, min %.4f ms, %.1f TFLOP/s\n",
               where.c_str(), *tuning_ms, m->median_ms, m->min_ms, tflops);
  if (same.has_value() && !*same) problems->Differs(where);
  return absl::OkStatus();
}

// The whole bench, into `out`. An error that ends it early is returned; `out` keeps what
// finished.
absl::Status RunBench(const Options& o, Json& out, Problems* problems) {
  RETURN_IF_ERROR(core::CudaDeviceCount().status());
  RETURN_IF_ERROR(core::cuda::SetDevice(core::Device::Cuda(0)));
  ASSIGN_OR_RETURN(const std::string device, core::CudaDeviceName(0));
  out["device"] = device;
  std::fprintf(stderr, "attention_bench: %s; B=%ld T=%ld H=%ld head_dim=%ld, %s outputs\n",
               device.c_str(), static_cast<long>(o.batch), static_cast<long>(o.seq_len),
               static_cast<long>(o.n_head), static_cast<long>(o.head_dim),
               o.out_bf16 ? "bf16" : "fp32");
  ASSIGN_OR_RETURN(const Problem p, MakeProblem(o));
  const Flops flops = CountFlops(o);
  const int64_t hd = o.head_dim;
  for (const auto& [kernel, name] :
       {std::pair(FlashKernel::kForward, "forward"), std::pair(FlashKernel::kBackwardKV, "dK/dV"),
        std::pair(FlashKernel::kBackwardQ, "dQ")}) {
    if (kernels::cuda::FlashShapeCount(kernel, hd) < 1) {
      problems->Add(absl::StrCat("the ", name, " kernel has no block shape at head_dim ", hd));
    }
  }

  Sweep forward("forward", flops.forward_model, flops.forward_executed, problems);
  out["forward"] = Json::array();
  for (int i = 0; i < kernels::cuda::FlashShapeCount(FlashKernel::kForward, hd); ++i) {
    FlashShapes shapes;
    shapes.forward = i;
    Json row = {{"shape", i},
                {"name", kernels::cuda::FlashShapeName(FlashKernel::kForward, hd, i)}};
    const absl::Status fatal = forward.Add(
        absl::StrCat("shape ", i),
        Measure(o.warmup, o.reps, p.ForwardOutputs(), [&] { return p.Forward(shapes); }), row);
    out["forward"].push_back(std::move(row));
    RETURN_IF_ERROR(fatal);
  }

  // Every backward runs on shape 0's forward outputs.
  FlashShapes reference_forward;
  reference_forward.forward = 0;
  const auto restore_forward = [&] {
    return StatusFromCuda(p.Forward(reference_forward), "the forward of shape 0");
  };
  RETURN_IF_ERROR(restore_forward());
  Sweep backward("backward", flops.backward_model, flops.backward_executed, problems);
  out["backward"] = Json::array();
  const int kv_shapes = kernels::cuda::FlashShapeCount(FlashKernel::kBackwardKV, hd);
  const int q_shapes = kernels::cuda::FlashShapeCount(FlashKernel::kBackwardQ, hd);
  for (int kv = 0; kv < kv_shapes; ++kv) {
    for (int q = 0; q < q_shapes; ++q) {
      FlashShapes shapes;
      shapes.backward_kv = kv;
      shapes.backward_q = q;
      Json row = {{"kv", kv},
                  {"q", q},
                  {"names",
                   {kernels::cuda::FlashShapeName(FlashKernel::kBackwardKV, hd, kv),
                    kernels::cuda::FlashShapeName(FlashKernel::kBackwardQ, hd, q)}}};
      const absl::Status fatal = backward.Add(
          absl::StrCat("kv ", kv, " q ", q),
          Measure(o.warmup, o.reps, p.BackwardOutputs(), [&] { return p.Backward(shapes); }), row);
      out["backward"].push_back(std::move(row));
      RETURN_IF_ERROR(fatal);
    }
  }

  // The tuner (NOTE [Flash block shapes]); the backward again on shape 0's forward outputs.
  const FlashShapes unpinned;
  Json tuned = {{"tuning_ms", Json::object()}};
  absl::Status fatal = AddTuned(
      "forward", o, p.ForwardOutputs(), [&] { return p.Forward(unpinned); }, flops.forward_model,
      forward, problems, tuned);
  if (fatal.ok()) fatal = restore_forward();
  if (fatal.ok()) {
    fatal = AddTuned(
        "backward", o, p.BackwardOutputs(), [&] { return p.Backward(unpinned); },
        flops.backward_model, backward, problems, tuned);
  }
  tuned["report"] = kernels::cuda::FlashTuningReport(o.batch, o.seq_len, o.n_head, hd);
  std::fprintf(stderr, "attention_bench: tuner: %s\n", tuned["report"].get<std::string>().c_str());
  out["tuned"] = std::move(tuned);
  return fatal;
}

#endif  // FSDP_WITH_CUDA

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times each block shape of the fused attention kernels and the tuner's choice; one "
      "JSON line on stdout (see the file's header).");
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<Options> o = ParseFlags();
  if (!o.ok()) {
    const std::string error(o.status().message());
    Print(Json{{"attention_bench", 1}, {"ok", false}, {"error", error}});
    return 2;
  }
  Json out = Skeleton(*o);
#ifdef FSDP_WITH_CUDA
  Problems problems;
  const absl::Status s = RunBench(*o, out, &problems);
  if (!s.ok()) problems.Add(s.ToString());
  out["ok"] = problems.empty();
  if (!problems.empty()) out["error"] = problems.Joined();
  Print(out);
  return problems.empty() ? 0 : 1;
#else
  out["error"] = "built without CUDA (--config=cuda)";
  Print(out);
  return 2;
#endif
}
