// GEMM micro-benchmark (issue 12 item 2): single-thread GFLOP/s of each candidate CPU GEMM
// library on the exact shapes the GPT benchmark's linears run (bench/cpu/README.md), each
// checked against a double-precision reference, as shipped (no environment variables; the
// thread count is set to 1 through each library's own API). Prints one JSON document.
//
//   bash bench/cpu/gemm.sh          # unpacks the libraries, builds the shims, runs this
//   bazel run -c opt //bench/cpu:gemm_bench --
//   --lib=openblas:cblas:/usr/lib/x86_64-linux-gnu/libopenblas.so.0
//
// Each --lib=NAME:KIND:PATH is loaded with dlopen (so libraries that are not installed, only
// unpacked, can be measured, and several BLAS libraries exporting the same symbols do not
// clash: RTLD_LOCAL|RTLD_DEEPBIND). KIND is how it is called:
//   cblas  cblas_sgemm (OpenBLAS, BLIS); threads set through openblas_set_num_threads or
//          bli_thread_set_num_threads; kernel choice from openblas_get_corename or
//          bli_arch_query_id/bli_arch_string
//   dnnl   oneDNN's dnnl_sgemm (row-major); threads through the omp_set_num_threads of the
//          libgomp it loaded; ISA from dnnl_get_effective_cpu_isa
//   shim   a bench/cpu shim exporting bench_sgemm (row-major, the signature below),
//          bench_info and bench_supported (libxsmm, Eigen: built by bench/cpu/gemm.sh)
// A library whose load fails, or whose shim says the CPU cannot run it, is reported with the
// reason and skipped; nothing aborts.
#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace {

// One GEMM of the model: C[m,n] = alpha op(A) op(B) + beta C, row-major, as nn::Gemm calls it.
struct Shape {
  std::string config;  // "V T C L H B"
  std::string name;    // e.g. "fc.forward"
  bool trans_a, trans_b;
  int64_t m, n, k;
  float beta;
  int64_t calls_per_step;  // how many times one training step of one rank runs it
};

struct Config {
  int64_t V, T, C, L, H, B;
};

std::vector<Shape> ShapesOf(const Config& c, int world) {
  std::vector<Shape> out;
  const std::string label = std::to_string(c.V) + " " + std::to_string(c.T) + " " +
                            std::to_string(c.C) + " " + std::to_string(c.L) + " " +
                            std::to_string(c.H) + " " + std::to_string(c.B);
  const int64_t rows = c.B * c.T / world;
  struct Lin {
    const char* name;
    int64_t in, out, per_step;
  };
  const Lin lins[] = {{"attn.qkv", c.C, 3 * c.C, c.L},
                      {"attn.proj", c.C, c.C, c.L},
                      {"mlp.fc", c.C, 4 * c.C, c.L},
                      {"mlp.proj", 4 * c.C, c.C, c.L},
                      {"lm_head", c.C, c.V, 1}};
  for (const Lin& l : lins) {
    // nn/linear.cc: y = x W^T; gx = g W; gW += g^T x.
    out.push_back({label, std::string(l.name) + ".forward", false, true, rows, l.out, l.in, 0.0f,
                   l.per_step});
    out.push_back({label, std::string(l.name) + ".grad_input", false, false, rows, l.in, l.out,
                   0.0f, l.per_step});
    out.push_back({label, std::string(l.name) + ".grad_weight", true, false, l.out, l.in, rows,
                   1.0f, l.per_step});
  }
  return out;
}

using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                            int, float, float*, int);
using DnnlSgemm = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);
using ShimSgemm = int (*)(int, int, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);
using RowMajorGemm = std::function<bool(const Shape&, const float*, const float*, float*)>;

constexpr int kCblasRowMajor = 101, kCblasNoTrans = 111, kCblasTrans = 112;

struct Library {
  std::string name, kind, path;
  std::string error;  // non-empty: not measured, and why
  nlohmann::json info = nlohmann::json::object();
  RowMajorGemm gemm;
};

// CPU seconds of the calling thread: on a machine shared with other jobs the wall clock
// counts the time other processes hold the core; this does not. Every library runs
// single-threaded in the calling thread (threads set to 1), so it is the GEMM's own time.
double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename F>
F Sym(void* handle, const char* name) {
  return reinterpret_cast<F>(dlsym(handle, name));
}

// cblas_sgemm of OpenBLAS or BLIS: threads set to 1, the kernel choice they report in info.
void BindCblas(void* h, Library* lib) {
  auto sgemm = Sym<CblasSgemm>(h, "cblas_sgemm");
  if (sgemm == nullptr) {
    lib->error = lib->path + ": no cblas_sgemm";
    return;
  }
  if (auto set = Sym<void (*)(int)>(h, "openblas_set_num_threads")) set(1);
  if (auto set = Sym<void (*)(int64_t)>(h, "bli_thread_set_num_threads")) set(1);
  if (auto core = Sym<const char* (*)()>(h, "openblas_get_corename")) {
    lib->info["openblas_core"] = core();
  }
  if (auto config = Sym<const char* (*)()>(h, "openblas_get_config")) {
    lib->info["openblas_config"] = config();
  }
  if (auto threads = Sym<int (*)()>(h, "openblas_get_num_threads")) {
    lib->info["threads"] = threads();
  }
  auto arch_id = Sym<int (*)()>(h, "bli_arch_query_id");
  auto arch_str = Sym<const char* (*)(int)>(h, "bli_arch_string");
  if (arch_id != nullptr && arch_str != nullptr) lib->info["blis_arch"] = arch_str(arch_id());
  if (auto version = Sym<const char* (*)()>(h, "bli_info_get_version_str")) {
    lib->info["blis_version"] = version();
  }
  if (auto threads = Sym<int64_t (*)()>(h, "bli_thread_get_num_threads")) {
    lib->info["threads"] = threads();
  }
  lib->gemm = [sgemm](const Shape& s, const float* A, const float* B, float* C) {
    const int lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n;
    sgemm(kCblasRowMajor, s.trans_a ? kCblasTrans : kCblasNoTrans,
          s.trans_b ? kCblasTrans : kCblasNoTrans, s.m, s.n, s.k, 1.0f, A, lda, B, ldb, s.beta, C,
          s.n);
    return true;
  };
}

// The name of a dnnl_cpu_isa_t value of oneDNN 2.6 (dnnl_types.h), with the value in hex.
std::string DnnlIsaName(unsigned v) {
  const char* name = v == 0x1     ? "sse41"
                     : v == 0x3   ? "avx"
                     : v == 0x7   ? "avx2"
                     : v == 0x407 ? "avx2_vnni"
                     : v == 0x27  ? "avx512_core"
                     : v == 0x67  ? "avx512_core_vnni"
                     : v == 0xe7  ? "avx512_core_bf16"
                     : v == 0x3e7 ? "avx512_core_amx"
                                  : "other";
  char hex[16];
  std::snprintf(hex, sizeof(hex), "0x%x", v);
  return std::string(name) + " (" + hex + ")";
}

// oneDNN's dnnl_sgemm: threads set to 1 through its libgomp, its version and ISA in info.
void BindDnnl(void* h, Library* lib) {
  auto sgemm = Sym<DnnlSgemm>(h, "dnnl_sgemm");
  if (sgemm == nullptr) {
    lib->error = lib->path + ": no dnnl_sgemm";
    return;
  }
  if (auto set = Sym<void (*)(int)>(h, "omp_set_num_threads")) {
    set(1);
    lib->info["threads"] = 1;
  }
  struct Version {
    int major, minor, patch;
    const char* hash;
    unsigned cpu_runtime, gpu_runtime;
  };
  if (auto version = Sym<const Version* (*)()>(h, "dnnl_version")) {
    const Version* v = version();
    lib->info["dnnl_version"] =
        std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  }
  if (auto isa = Sym<unsigned (*)()>(h, "dnnl_get_effective_cpu_isa")) {
    lib->info["dnnl_effective_isa"] = DnnlIsaName(isa());
  }
  lib->gemm = [sgemm](const Shape& s, const float* A, const float* B, float* C) {
    const int64_t lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n;
    return sgemm(s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N', s.m, s.n, s.k, 1.0f, A, lda, B, ldb,
                 s.beta, C, s.n) == 0;
  };
}

// A bench/cpu shim: refused with its reason when it says this CPU cannot run it.
void BindShim(void* h, Library* lib) {
  auto sgemm = Sym<ShimSgemm>(h, "bench_sgemm");
  auto supported = Sym<const char* (*)()>(h, "bench_supported");
  auto info = Sym<const char* (*)()>(h, "bench_info");
  if (sgemm == nullptr || supported == nullptr || info == nullptr) {
    lib->error = lib->path + ": not a bench/cpu shim (bench_sgemm/bench_supported/bench_info)";
    return;
  }
  const char* why_not = supported();
  if (why_not != nullptr && why_not[0] != '\0') {
    lib->error = std::string("cannot run on this CPU: ") + why_not;
    return;
  }
  lib->info["shim"] = info();
  lib->gemm = [sgemm](const Shape& s, const float* A, const float* B, float* C) {
    const int64_t lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n;
    return sgemm(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, A, lda, B, ldb, s.beta, C, s.n) == 0;
  };
}

// The library of one --lib=NAME:KIND:PATH; on failure `error` says why.
Library Load(const std::string& spec) {
  Library lib;
  const size_t a = spec.find(':');
  const size_t b = a == std::string::npos ? a : spec.find(':', a + 1);
  if (b == std::string::npos) {
    lib.name = spec;
    lib.error = "--lib=" + spec + ": expected NAME:KIND:PATH";
    return lib;
  }
  lib.name = spec.substr(0, a);
  lib.kind = spec.substr(a + 1, b - a - 1);
  lib.path = spec.substr(b + 1);
  void* h = dlopen(lib.path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (h == nullptr) {
    const char* e = dlerror();
    lib.error = std::string("dlopen ") + lib.path + ": " + (e ? e : "?");
    return lib;
  }
  if (lib.kind == "cblas") {
    BindCblas(h, &lib);
  } else if (lib.kind == "dnnl") {
    BindDnnl(h, &lib);
  } else if (lib.kind == "shim") {
    BindShim(h, &lib);
  } else {
    lib.error = "--lib=" + spec + ": KIND must be cblas, dnnl or shim";
  }
  return lib;
}

// C = op(A) op(B) + beta C0 in double, row-major.
std::vector<double> Reference(const Shape& s, const std::vector<float>& A,
                              const std::vector<float>& B, const std::vector<float>& C0) {
  std::vector<double> C(static_cast<size_t>(s.m * s.n));
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < s.k; ++p) {
        const double a = s.trans_a ? A[p * s.m + i] : A[i * s.k + p];
        const double b = s.trans_b ? B[j * s.k + p] : B[p * s.n + j];
        acc += a * b;
      }
      C[i * s.n + j] = acc + static_cast<double>(s.beta) * C0[i * s.n + j];
    }
  }
  return C;
}

struct CpuFacts {
  std::string model_name, vendor;
  int family = -1, model = -1;
  double mhz = 0;
  std::vector<std::string> simd_flags;
  int fma_lanes = 0;  // fp32 lanes of the widest FMA vector
  int fma_units = 2;  // FMA pipes per core assumed (Zen/Skylake-SP server parts: 2)
};

CpuFacts ReadCpu() {
  CpuFacts f;
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(in, line)) {
    auto value = [&]() {
      const size_t c = line.find(':');
      std::string v = c == std::string::npos ? "" : line.substr(c + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    };
    if (line.rfind("model name", 0) == 0 && f.model_name.empty()) f.model_name = value();
    if (line.rfind("vendor_id", 0) == 0 && f.vendor.empty()) f.vendor = value();
    if (line.rfind("cpu family", 0) == 0 && f.family < 0) f.family = std::atoi(value().c_str());
    if (line.rfind("model\t", 0) == 0 && f.model < 0) f.model = std::atoi(value().c_str());
    if (line.rfind("cpu MHz", 0) == 0 && f.mhz == 0) f.mhz = std::atof(value().c_str());
    if (line.rfind("flags", 0) == 0 && flags.empty()) flags = value();
  }
  std::istringstream words(flags);
  std::string w;
  bool fma = false, avx512f = false, avx2 = false;
  while (words >> w) {
    if (w.rfind("avx", 0) == 0 || w == "fma" || w.rfind("sse", 0) == 0 || w.rfind("amx", 0) == 0) {
      f.simd_flags.push_back(w);
    }
    fma |= w == "fma";
    avx512f |= w == "avx512f";
    avx2 |= w == "avx2";
  }
  f.fma_lanes = avx512f ? 16 : (fma ? 8 : 0);
  return f;
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) {
    if (!cur.empty()) out.push_back(cur);
  }
  return out;
}

struct Options {
  std::vector<std::string> lib_specs;
  double min_seconds = 0.2;
  int world = 2;
  std::string configs = "64,32,64,2,4,16;256,64,128,4,4,16;512,128,256,6,8,8";
};

// Reads the command line into `o` (loading each --preload); returns 0, or the exit status
// after printing what is wrong.
int ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--lib=", 0) == 0) {
      o->lib_specs.push_back(a.substr(6));
    } else if (a.rfind("--preload=", 0) == 0) {
      // A dependency of a --lib that is unpacked, not installed (oneDNN's libOpenCL.so.1):
      // once loaded, the dynamic linker satisfies that soname with it.
      if (dlopen(a.c_str() + 10, RTLD_NOW | RTLD_GLOBAL) == nullptr) {
        const char* e = dlerror();
        std::fprintf(stderr, "gemm_bench: --preload=%s: %s\n", a.c_str() + 10, e ? e : "?");
        return 1;
      }
    } else if (a.rfind("--min_seconds=", 0) == 0) {
      o->min_seconds = std::atof(a.c_str() + 14);
    } else if (a.rfind("--world_size=", 0) == 0) {
      o->world = std::atoi(a.c_str() + 13);
    } else if (a.rfind("--configs=", 0) == 0) {
      o->configs = a.substr(10);
    } else {
      std::fprintf(stderr,
                   "gemm_bench: unknown argument '%s'; use --lib=NAME:KIND:PATH (repeatable), "
                   "--preload=PATH (repeatable), "
                   "--min_seconds=S, --world_size=N, --configs='V,T,C,L,H,B;...'\n",
                   a.c_str());
      return 2;
    }
  }
  if (o->lib_specs.empty() || o->world < 1 || !(o->min_seconds > 0)) {
    std::fprintf(stderr,
                 "gemm_bench: need at least one --lib, --world_size >= 1, --min_seconds > 0\n");
    return 2;
  }
  return 0;
}

// The shapes of every config of --configs ("V,T,C,L,H,B;..."), in order; returns 0, or the
// exit status after printing what is wrong.
int ParseShapes(const std::string& configs, int world, std::vector<Shape>* shapes) {
  for (const std::string& cs : Split(configs, ';')) {
    std::vector<std::string> v = Split(cs, ',');
    if (v.size() != 6) {
      std::fprintf(stderr, "gemm_bench: --configs entry '%s' needs 6 numbers V,T,C,L,H,B\n",
                   cs.c_str());
      return 2;
    }
    Config c{std::atoll(v[0].c_str()), std::atoll(v[1].c_str()), std::atoll(v[2].c_str()),
             std::atoll(v[3].c_str()), std::atoll(v[4].c_str()), std::atoll(v[5].c_str())};
    for (const Shape& s : ShapesOf(c, world)) shapes->push_back(s);
  }
  return 0;
}

// The load averages of getloadavg, or null where it fails.
nlohmann::json LoadAverage() {
  double l[3];
  if (getloadavg(l, 3) == 3) return {l[0], l[1], l[2]};
  return nullptr;
}

// The top of the document: the CPU, its one-core peak (`peak`, GFLOP/s), how time is taken.
nlohmann::json DescribeMachine(const CpuFacts& cpu, double peak, int world) {
  nlohmann::json out;
  out["cpu"] = {
      {"model_name", cpu.model_name}, {"vendor", cpu.vendor}, {"family", cpu.family},
      {"model", cpu.model},           {"mhz", cpu.mhz},       {"simd_flags", cpu.simd_flags}};
  out["peak_gflops_one_core"] = {
      {"gflops", peak},
      {"formula", std::to_string(cpu.fma_units) + " FMA units x " + std::to_string(cpu.fma_lanes) +
                      " fp32 lanes x 2 flops x " + std::to_string(cpu.mhz / 1000.0) +
                      " GHz (cpu MHz of /proc/cpuinfo; the widest FMA the flags show" +
                      (cpu.fma_lanes == 16 ? ": AVX-512)" : ": AVX2/FMA, 256-bit)")},
      {"note",
       "an upper bound; a core that splits 256-bit FMAs into two 128-bit halves "
       "(AMD Zen 1) peaks at half of it"}};
  out["threads"] = 1;
  out["timing"] =
      "gflops: thread CPU time (CLOCK_THREAD_CPUTIME_ID), best of 3 batches of at "
      "least min_seconds/3 each; gflops_wall_clock beside it";
  out["load_average_start"] = LoadAverage();
  out["world_size"] = world;
  return out;
}

nlohmann::json DescribeLibraries(const std::vector<Library>& libs) {
  nlohmann::json lib_json = nlohmann::json::array();
  for (const Library& l : libs) {
    nlohmann::json j = {{"name", l.name}, {"kind", l.kind}, {"path", l.path}, {"info", l.info}};
    if (!l.error.empty()) j["error"] = l.error;
    lib_json.push_back(j);
  }
  return lib_json;
}

// What the measurements add up to, per library (index as in the library list).
struct Tally {
  explicit Tally(size_t libs)
      : step_seconds(libs, 0.0), step_flops(libs, 0.0), worst_error(libs, 0.0), failures(libs, 0) {}
  // Flops and seconds weighted by how often a training step runs each shape.
  std::vector<double> step_seconds, step_flops;
  // The same per config: config label -> per library.
  std::vector<std::string> config_labels;
  std::vector<std::vector<double>> config_seconds;
  std::vector<double> config_flops;
  std::vector<double> worst_error;
  std::vector<int> failures;
};

// One shape's random operands and their double-precision product.
struct Operands {
  std::vector<float> A, B, C0;
  std::vector<double> ref;
  double ref_max = 0;  // the largest |ref| entry
};

Operands MakeOperands(const Shape& s, std::mt19937& rng,
                      std::uniform_real_distribution<float>& dist) {
  Operands o;
  o.A.resize(static_cast<size_t>(s.m * s.k));
  o.B.resize(static_cast<size_t>(s.k * s.n));
  o.C0.resize(static_cast<size_t>(s.m * s.n));
  for (float& x : o.A) x = dist(rng);
  for (float& x : o.B) x = dist(rng);
  for (float& x : o.C0) x = dist(rng);
  o.ref = Reference(s, o.A, o.B, o.C0);
  for (double r : o.ref) o.ref_max = std::max(o.ref_max, std::fabs(r));
  return o;
}

// The largest error of C relative to the largest reference entry (entries near 0 do not
// blow it up), and whether every entry is finite.
double MaxRelativeError(const std::vector<float>& C, const Operands& o, bool* finite) {
  double max_rel = 0;
  *finite = true;
  for (size_t i = 0; i < C.size(); ++i) {
    *finite &= std::isfinite(C[i]);
    max_rel = std::max(max_rel, std::fabs(C[i] - o.ref[i]) / std::max(o.ref_max, 1e-30));
  }
  return max_rel;
}

// Seconds per call, thread CPU time (see ThreadCpuSeconds) and wall clock: repeated until
// min_seconds / 3 of CPU time, best of 3 batches, after one warm-up call.
void TimeGemm(const Library& lib, const Shape& s, const Operands& o, double min_seconds,
              double* best, double* best_wall) {
  std::vector<float> Ct = o.C0;
  lib.gemm(s, o.A.data(), o.B.data(), Ct.data());  // warm-up (packing buffers, JIT)
  int64_t reps = 1;
  *best = INFINITY;
  *best_wall = INFINITY;
  for (int round = 0; round < 3; ++round) {
    for (;;) {
      const double c0 = ThreadCpuSeconds(), w0 = WallSeconds();
      for (int64_t i = 0; i < reps; ++i) lib.gemm(s, o.A.data(), o.B.data(), Ct.data());
      const double dt = ThreadCpuSeconds() - c0, wall = WallSeconds() - w0;
      if (dt >= min_seconds / 3 || reps >= (int64_t{1} << 30)) {
        *best = std::min(*best, dt / reps);
        *best_wall = std::min(*best_wall, wall / reps);
        break;
      }
      reps = std::max<int64_t>(reps * 2,
                               static_cast<int64_t>(reps * (min_seconds / 3) / std::max(dt, 1e-9)));
    }
  }
}

// One library `li` on one shape: checked, then timed; its result entry, and `t` updated.
nlohmann::json MeasureOne(const Library& lib, size_t li, const Shape& s, const Operands& o,
                          double min_seconds, double peak, Tally* t) {
  nlohmann::json r = {{"config", s.config},
                      {"gemm", s.name},
                      {"op", std::string(s.trans_a ? "T" : "N") + (s.trans_b ? "T" : "N")},
                      {"m", s.m},
                      {"n", s.n},
                      {"k", s.k},
                      {"beta", s.beta},
                      {"library", lib.name}};
  // Correctness on a fresh copy of C (beta = 1 shapes accumulate into it).
  std::vector<float> C = o.C0;
  if (!lib.gemm(s, o.A.data(), o.B.data(), C.data())) {
    r["error"] = "the call returned an error";
    ++t->failures[li];
    return r;
  }
  bool finite = true;
  const double max_rel = MaxRelativeError(C, o, &finite);
  // fp32 accumulation over k terms of size <= 1: a few k * 2^-24 relative at most.
  const double tolerance = 1e-5 * std::max<double>(1.0, std::sqrt(static_cast<double>(s.k)));
  const bool correct = finite && max_rel <= tolerance;
  if (!correct) ++t->failures[li];
  t->worst_error[li] = std::max(t->worst_error[li], finite ? max_rel : INFINITY);
  double best = INFINITY, best_wall = INFINITY;
  TimeGemm(lib, s, o, min_seconds, &best, &best_wall);
  const double flops = 2.0 * s.m * s.n * s.k;
  r["gflops_wall_clock"] = flops / best_wall / 1e9;
  const double gflops = flops / best / 1e9;
  t->step_seconds[li] += best * s.calls_per_step;
  t->config_seconds.back()[li] += best * s.calls_per_step;
  t->step_flops[li] += flops * s.calls_per_step;
  r["gflops"] = gflops;
  r["fraction_of_peak"] = peak > 0 ? gflops / peak : 0.0;
  r["max_rel_error"] = finite ? max_rel : -1.0;
  r["correct"] = correct;
  return r;
}

// Every library that loaded on every shape, in shape order: the "results" entries.
nlohmann::json MeasureAll(const std::vector<Library>& libs, const std::vector<Shape>& shapes,
                          double min_seconds, double peak, Tally* t) {
  std::mt19937 rng(12345);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  nlohmann::json results = nlohmann::json::array();
  for (const Shape& s : shapes) {
    const Operands o = MakeOperands(s, rng, dist);
    const double flops = 2.0 * s.m * s.n * s.k;
    if (t->config_labels.empty() || t->config_labels.back() != s.config) {
      t->config_labels.push_back(s.config);
      t->config_seconds.emplace_back(libs.size(), 0.0);
      t->config_flops.push_back(0.0);
    }
    t->config_flops.back() += flops * s.calls_per_step;
    for (size_t li = 0; li < libs.size(); ++li) {
      if (!libs[li].error.empty()) continue;
      results.push_back(MeasureOne(libs[li], li, s, o, min_seconds, peak, t));
    }
  }
  return results;
}

// Per library: GFLOP/s of each config's step (its linears' GEMMs weighted by calls per
// step), its speed-up over the first --lib (the one the build links) per config, and the
// geometric mean of those speed-ups, so that each config counts once whatever its size.
// Sorted by that mean, highest first; `geomean` gets it per library (0: none).
nlohmann::json Summarize(const std::vector<Library>& libs, const Tally& t,
                         std::vector<double>* geomean) {
  nlohmann::json summary = nlohmann::json::array();
  geomean->assign(libs.size(), 0.0);
  for (size_t li = 0; li < libs.size(); ++li) {
    if (!libs[li].error.empty() || t.step_seconds[li] <= 0) continue;
    nlohmann::json per_config = nlohmann::json::object();
    double log_sum = 0;
    int n = 0;
    for (size_t c = 0; c < t.config_labels.size(); ++c) {
      const double sec = t.config_seconds[c][li];
      nlohmann::json j = {{"gflops", t.config_flops[c] / sec / 1e9}, {"seconds_per_step", sec}};
      if (libs[0].error.empty() && t.config_seconds[c][0] > 0) {
        const double speedup = t.config_seconds[c][0] / sec;
        j["speedup_vs_" + libs[0].name] = speedup;
        log_sum += std::log(speedup);
        ++n;
      }
      per_config[t.config_labels[c]] = j;
    }
    (*geomean)[li] = n > 0 ? std::exp(log_sum / n) : 0.0;
    summary.push_back(
        {{"library", libs[li].name},
         {"per_config", per_config},
         {"geomean_speedup_vs_" + libs[0].name, (*geomean)[li]},
         {"step_weighted_gflops_all_configs", t.step_flops[li] / t.step_seconds[li] / 1e9},
         {"worst_max_rel_error", t.worst_error[li]},
         {"incorrect_or_failed_shapes", t.failures[li]}});
  }
  std::sort(summary.begin(), summary.end(), [&](const nlohmann::json& a, const nlohmann::json& b) {
    const std::string key = "geomean_speedup_vs_" + libs[0].name;
    return a[key].get<double>() > b[key].get<double>();
  });
  return summary;
}

// The library correct on every shape with the highest geometric mean, and its margin over
// the runner-up; null when no library qualifies.
nlohmann::json Winner(const std::vector<Library>& libs, const std::vector<double>& geomean,
                      const std::vector<int>& failures) {
  int best_lib = -1, second_lib = -1;
  for (size_t li = 0; li < libs.size(); ++li) {
    if (geomean[li] <= 0 || failures[li] != 0) continue;
    if (best_lib < 0 || geomean[li] > geomean[best_lib]) {
      second_lib = best_lib;
      best_lib = static_cast<int>(li);
    } else if (second_lib < 0 || geomean[li] > geomean[second_lib]) {
      second_lib = static_cast<int>(li);
    }
  }
  if (best_lib < 0) return nullptr;
  nlohmann::json w = {{"library", libs[best_lib].name},
                      {"geomean_speedup_vs_" + libs[0].name, geomean[best_lib]}};
  if (second_lib >= 0) {
    w["runner_up"] = libs[second_lib].name;
    w["geomean_speedup_vs_runner_up"] = geomean[best_lib] / geomean[second_lib];
  }
  w["criterion"] =
      "highest geometric mean over the configs of the speed-up of one training step's linear "
      "GEMMs (shapes weighted by calls per step) over the first --lib, among libraries "
      "correct on every shape";
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const int rc = ParseArgs(argc, argv, &o); rc != 0) return rc;
  std::vector<Shape> shapes;
  if (const int rc = ParseShapes(o.configs, o.world, &shapes); rc != 0) return rc;

  const CpuFacts cpu = ReadCpu();
  const double peak = cpu.fma_units * cpu.fma_lanes * 2.0 * cpu.mhz / 1000.0;
  nlohmann::json out = DescribeMachine(cpu, peak, o.world);
  std::vector<Library> libs;
  for (const std::string& spec : o.lib_specs) libs.push_back(Load(spec));
  out["libraries"] = DescribeLibraries(libs);

  Tally tally(libs.size());
  out["results"] = MeasureAll(libs, shapes, o.min_seconds, peak, &tally);
  std::vector<double> geomean;
  out["summary"] = Summarize(libs, tally, &geomean);
  if (nlohmann::json l = LoadAverage(); !l.is_null()) out["load_average_end"] = l;
  if (nlohmann::json w = Winner(libs, geomean, tally.failures); !w.is_null()) out["winner"] = w;
  std::cout << out.dump(2) << std::endl;
  return 0;
}
