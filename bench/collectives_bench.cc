// collectives_bench: algorithm and bus bandwidth of every collective per size, with the
// nccl-tests definitions, plus this machine's memcpy bandwidth measured in the same run
// as the CPU-side limit. JSON on stdout.
//
//   bazel run -c opt //bench:collectives_bench -- --backend=gloo --nproc=2
//   bazel run -c opt //bench:collectives_bench -- --backend=shm --nproc=2
//   bazel run --config=cuda //bench:collectives_bench -- --backend=nccl --nproc=1
//   launch --nproc=4 -- collectives_bench --from_env        # one rank per process
//
// Definitions (nccl-tests, doc/PERFORMANCE.md), with S the size in bytes:
//   all_gather: S = output bytes (n x input),  busbw = algbw * (n-1)/n
//   reduce_scatter: S = input bytes (n x output), busbw = algbw * (n-1)/n
//   all_reduce: S = tensor bytes, busbw = algbw * 2(n-1)/n
//   broadcast: S = tensor bytes, busbw = algbw
//   algbw = S / time, time = mean over iterations of the slowest rank, in GB/s (1e9).
// Ranks run as threads of this process by default (the gloo ones over loopback TCP, the
// shm ones through a shared-memory segment), each with its own group over one HashStore.
// memcpy_GBps is bytes copied per second by one thread; with gloo on one host every
// byte a rank receives is also copied at least once, so busbw stays below it; shm copies
// each byte into a slot and out of it with --shm_transport=slots, once (process_vm_readv
// from the owner) with --shm_transport=cma (busbw_over_memcpy, per op and size, says how
// close a backend comes).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/flag_checks.h"
#include "comm/gloo_process_group.h"
#include "comm/hash_store.h"
#include "comm/init_from_env.h"
#include "comm/process_group.h"
#include "comm/shm_process_group.h"
#include "core/cuda_device.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "nlohmann/json.hpp"

#ifdef FSDP_WITH_CUDA
#include "comm/nccl_process_group.h"
#endif

ABSL_FLAG(std::string, backend, "gloo",
          "gloo, shm (shared memory, ranks on one host) or nccl (needs --config=cuda)");
ABSL_FLAG(int, nproc, 2, "ranks as threads in this process (ignored with --from_env)");
ABSL_FLAG(bool, from_env, false, "join the job described by RANK, WORLD_SIZE, ... (a launcher)");
ABSL_FLAG(int64_t, min_bytes, 4 << 10, "smallest message, bytes per rank (>= 4)");
ABSL_FLAG(int64_t, max_bytes, 64 << 20, "largest message, bytes per rank (>= 4)");
ABSL_FLAG(int64_t, step, 4, "factor between successive sizes (>= 2)");
ABSL_FLAG(std::string, ops, "all_gather,reduce_scatter,all_reduce,broadcast",
          "comma-separated collectives to measure");
ABSL_FLAG(int64_t, target_bytes, 256 << 20,
          "bytes each (op, size) should move; sets its iteration count (2 to 100)");
ABSL_FLAG(int, warmup, 1, "untimed iterations per (op, size) (>= 0)");
ABSL_FLAG(int64_t, shm_slot_bytes, comm::ShmOptions().slot_bytes,
          "--backend=shm with ranks as threads: ShmOptions.slot_bytes");
ABSL_FLAG(int64_t, shm_spin_us, absl::ToInt64Microseconds(comm::ShmOptions().spin_time),
          "--backend=shm with ranks as threads: ShmOptions.spin_time, microseconds");
ABSL_FLAG(std::string, shm_transport, "slots",
          "--backend=shm: ShmOptions.transport, auto, slots or cma (with --from_env: a group of "
          "that transport made beside the launcher's)");
ABSL_FLAG(int64_t, shm_cma_min_bytes, comm::ShmOptions().cma_min_bytes,
          "--backend=shm: ShmOptions.cma_min_bytes");

namespace {

struct Flags {
  std::string backend = "gloo";
  int nproc = 2;
  bool from_env = false;
  int64_t min_bytes = 4 << 10;
  int64_t max_bytes = 64 << 20;
  int64_t step = 4;
  std::vector<std::string> ops = {"all_gather", "reduce_scatter", "all_reduce", "broadcast"};
  // Bytes each (op, size) should move, which sets its iteration count (2 to 100).
  int64_t target_bytes = 256 << 20;
  int warmup = 1;
  int64_t shm_slot_bytes = comm::ShmOptions().slot_bytes;
  int64_t shm_spin_us = absl::ToInt64Microseconds(comm::ShmOptions().spin_time);
  comm::ShmTransport shm_transport = comm::ShmTransport::kAuto;
  int64_t shm_cma_min_bytes = comm::ShmOptions().cma_min_bytes;
  absl::Duration timeout = absl::Seconds(120);
};

absl::StatusOr<Flags> ParseFlags() {
  Flags f;
  f.backend = absl::GetFlag(FLAGS_backend);
  f.nproc = absl::GetFlag(FLAGS_nproc);
  f.from_env = absl::GetFlag(FLAGS_from_env);
  f.min_bytes = absl::GetFlag(FLAGS_min_bytes);
  f.max_bytes = absl::GetFlag(FLAGS_max_bytes);
  f.step = absl::GetFlag(FLAGS_step);
  f.target_bytes = absl::GetFlag(FLAGS_target_bytes);
  f.warmup = absl::GetFlag(FLAGS_warmup);
  f.shm_slot_bytes = absl::GetFlag(FLAGS_shm_slot_bytes);
  f.shm_spin_us = absl::GetFlag(FLAGS_shm_spin_us);
  f.shm_cma_min_bytes = absl::GetFlag(FLAGS_shm_cma_min_bytes);
  const std::string transport = absl::GetFlag(FLAGS_shm_transport);
  if (transport == "auto") {
    f.shm_transport = comm::ShmTransport::kAuto;
  } else if (transport == "slots") {
    f.shm_transport = comm::ShmTransport::kSlots;
  } else if (transport == "cma") {
    f.shm_transport = comm::ShmTransport::kCrossMemoryAttach;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "collectives_bench: --shm_transport must be auto, slots or cma, got ", transport));
  }
  f.ops = absl::StrSplit(absl::GetFlag(FLAGS_ops), ',', absl::SkipEmpty());
  RETURN_IF_ERROR(bench::FlagsAtLeast("collectives_bench", {{"nproc", f.nproc, 1},
                                                            {"min_bytes", f.min_bytes, 4},
                                                            {"max_bytes", f.max_bytes, 4},
                                                            {"step", f.step, 2},
                                                            {"target_bytes", f.target_bytes, 1},
                                                            {"warmup", f.warmup, 0}}));
  if (f.backend != "gloo" && f.backend != "nccl" && f.backend != "shm") {
    return absl::InvalidArgumentError(
        absl::StrCat("collectives_bench: --backend must be gloo, shm or nccl, got ", f.backend));
  }
  for (const std::string& op : f.ops) {
    if (op != "all_gather" && op != "reduce_scatter" && op != "all_reduce" && op != "broadcast") {
      return absl::InvalidArgumentError(absl::StrCat("collectives_bench: unknown op ", op));
    }
  }
  return f;
}

double BusFactor(const std::string& op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "broadcast") return 1.0;
  return static_cast<double>(n - 1) / n;
}

// Bytes copied per second by one thread (best of 5 copies of 64 MiB, pages touched
// first so page faults are not timed).
double MeasureMemcpyGBps(int64_t* bytes_out) {
  const size_t bytes = size_t{64} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, bytes / s / 1e9);
    a[i] = b[bytes - 1 - i];  // keep the copies observable
  }
  *bytes_out = static_cast<int64_t>(bytes);
  return best;
}

struct Row {
  std::string op;
  int64_t bytes = 0;
  int64_t count = 0;
  int iters = 0;
  double seconds = 0;  // mean per iteration, slowest rank
};

absl::Status Finish(absl::StatusOr<std::shared_ptr<comm::Work>> work, absl::Duration timeout) {
  if (!work.ok()) return work.status();
  return (*work)->Wait(timeout);
}

// Runs the whole sweep on one rank; rank 0 fills `rows`.
absl::Status RunRank(comm::ProcessGroup& g, core::Device device, const Flags& f,
                     std::vector<Row>* rows) {
  const int n = g.size();
  const core::MemoryTag tag = core::MemoryTag::kComm;
  for (const std::string& op : f.ops) {
    for (int64_t s = f.min_bytes; s <= f.max_bytes; s *= f.step) {
      // Elements: a multiple of n so the sharded ops split evenly.
      const int64_t count = std::max<int64_t>(n, (s / 4) / n * n);
      const int64_t bytes = count * 4;
      const int iters = static_cast<int>(
          std::clamp<int64_t>(f.target_bytes / std::max<int64_t>(bytes, 1), 2, 100));
      ASSIGN_OR_RETURN(core::Tensor full,
                       core::Tensor::Allocate({count}, core::DType::kFloat32, tag, device));
      ASSIGN_OR_RETURN(core::Tensor part,
                       core::Tensor::Allocate({count / n}, core::DType::kFloat32, tag, device));
      full.Fill(1.0f);
      part.Fill(1.0f);
      auto issue = [&]() -> absl::StatusOr<std::shared_ptr<comm::Work>> {
        if (op == "all_gather") {
          comm::AllGatherOptions o;
          o.timeout = f.timeout;
          return g.AllGather(part, full, o);
        }
        if (op == "reduce_scatter") {
          comm::ReduceScatterOptions o;
          o.timeout = f.timeout;
          return g.ReduceScatter(full, part, o);
        }
        if (op == "all_reduce") {
          comm::AllReduceOptions o;
          o.timeout = f.timeout;
          return g.AllReduce(full, o);
        }
        comm::BroadcastOptions o;
        o.timeout = f.timeout;
        return g.Broadcast(full, o);
      };
      for (int i = 0; i < f.warmup; ++i) RETURN_IF_ERROR(Finish(issue(), f.timeout));
      RETURN_IF_ERROR(Finish(g.Barrier(comm::BarrierOptions{}), f.timeout));
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<std::shared_ptr<comm::Work>> works;
      for (int i = 0; i < iters; ++i) {
        ASSIGN_OR_RETURN(auto w, issue());
        works.push_back(std::move(w));
      }
      for (auto& w : works) RETURN_IF_ERROR(w->Wait(f.timeout));
      const double mine =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
      // The slowest rank's time, via a max all-reduce (on the group's device).
      ASSIGN_OR_RETURN(core::Tensor t,
                       core::Tensor::Allocate({1}, core::DType::kFloat32, tag, device));
      t.Fill(static_cast<float>(mine));
      comm::AllReduceOptions max;
      max.reduce_op = comm::ReduceOp::kMax;
      RETURN_IF_ERROR(Finish(g.AllReduce(t, max), f.timeout));
      core::Tensor host = core::Tensor::Zeros({1});
      RETURN_IF_ERROR(host.CopyFrom(t));
      if (g.rank() == 0) rows->push_back(Row{op, bytes, count, iters, host.ToVector()[0]});
    }
  }
  return absl::OkStatus();
}

// The ShmOptions the --shm_* flags set.
comm::ShmOptions ShmOptionsOf(const Flags& f) {
  comm::ShmOptions o;
  o.slot_bytes = f.shm_slot_bytes;
  o.spin_time = absl::Microseconds(f.shm_spin_us);
  o.transport = f.shm_transport;
  o.cma_min_bytes = f.shm_cma_min_bytes;
  return o;
}

absl::StatusOr<std::shared_ptr<comm::ProcessGroup>> MakeThreadGroup(
    const Flags& f, std::shared_ptr<comm::Store> store, int rank, core::Device* device) {
  if (f.backend == "gloo") {
    comm::GlooOptions o;
    o.rendezvous_timeout = absl::Seconds(60);
    ASSIGN_OR_RETURN(auto g, comm::GlooProcessGroup::Create(store, rank, f.nproc, o));
    return std::shared_ptr<comm::ProcessGroup>(g);
  }
  if (f.backend == "shm") {
    comm::ShmOptions o = ShmOptionsOf(f);
    o.rendezvous_timeout = absl::Seconds(60);
    ASSIGN_OR_RETURN(auto g, comm::ShmProcessGroup::Create(store, rank, f.nproc, o));
    return std::shared_ptr<comm::ProcessGroup>(g);
  }
#ifdef FSDP_WITH_CUDA
  ASSIGN_OR_RETURN(int gpus, core::CudaDeviceCount());
  if (f.nproc > gpus) {
    return absl::InvalidArgumentError(absl::StrCat("--nproc=", f.nproc, " NCCL ranks need ",
                                                   f.nproc, " GPUs; this machine has ", gpus));
  }
  *device = core::Device::Cuda(rank);
  comm::NcclOptions o;
  ASSIGN_OR_RETURN(auto g, comm::NcclProcessGroup::Create(store, rank, f.nproc, *device, o));
  return std::shared_ptr<comm::ProcessGroup>(g);
#else
  (void)device;
  return absl::FailedPreconditionError(
      "--backend=nccl needs a build with --config=cuda (bazel run --config=cuda ...)");
#endif
}

// What the sweep found: rank 0's rows, and what the report says about the run.
struct Sweep {
  std::vector<Row> rows;
  int world = 0;
  int my_rank = 0;
  std::string device_name = "cpu";
  std::string shm_transport_name;  // what the shm groups use
};

// This process is one rank of the job a launcher describes (--from_env).
absl::Status RunFromEnv(const Flags& f, Sweep* sweep) {
  comm::InitOptions init;
  init.backend = f.backend == "nccl"  ? comm::Backend::kNccl
                 : f.backend == "shm" ? comm::Backend::kShm
                                      : comm::Backend::kGloo;
  ASSIGN_OR_RETURN(comm::Distributed d, comm::InitFromEnv(init));
  sweep->world = d.group->size();
  sweep->my_rank = d.group->rank();
  sweep->device_name = d.device.ToString();
  std::shared_ptr<comm::ProcessGroup> group = d.group;
  if (f.backend == "shm") {
    // A group with the shm flags, beside the launcher's default one.
    comm::ShmOptions o = ShmOptionsOf(f);
    o.name = "bench_shm";
    ASSIGN_OR_RETURN(std::shared_ptr<comm::ShmProcessGroup> g,
                     comm::ShmProcessGroup::Create(d.store, sweep->my_rank, sweep->world, o));
    sweep->shm_transport_name = g->transport_name();
    group = g;
  }
  RETURN_IF_ERROR(RunRank(*group, d.device, f, &sweep->rows));
  return Finish(d.group->Barrier(comm::BarrierOptions{}), f.timeout);
}

// --nproc ranks as threads of this process, over one HashStore; the first error, with its
// rank.
absl::Status RunThreads(const Flags& f, Sweep* sweep) {
  sweep->world = f.nproc;
  absl::Mutex mu;
  absl::Status first_error;
  auto store = std::make_shared<comm::HashStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < f.nproc; ++r) {
    threads.emplace_back([&, r] {
      // Each rank counts its own buffers, as separate processes would.
      core::ScopedAllocator scope(std::make_shared<core::Allocator>(core::Device::Cpu()));
      core::Device device = core::Device::Cpu();
      absl::StatusOr<std::shared_ptr<comm::ProcessGroup>> g = MakeThreadGroup(f, store, r, &device);
      absl::Status s = g.ok() ? RunRank(**g, device, f, &sweep->rows) : g.status();
      if (s.ok() && r == 0) {
        absl::MutexLock lock(&mu);
        sweep->device_name = device.ToString();
        if (auto* shm = dynamic_cast<comm::ShmProcessGroup*>(g->get())) {
          sweep->shm_transport_name = shm->transport_name();
        }
      }
      if (g.ok() && s.ok()) s = Finish((*g)->Barrier(comm::BarrierOptions{}), f.timeout);
      absl::MutexLock lock(&mu);
      if (!s.ok() && first_error.ok()) {
        first_error = core::Annotate(s, absl::StrCat("rank ", r));
      }
    });
  }
  for (auto& t : threads) t.join();
  return first_error;
}

// The JSON document: the run, the memcpy limit, and per op and size algbw and busbw.
nlohmann::json Report(const Flags& f, const Sweep& sweep, int64_t memcpy_bytes,
                      double memcpy_gbps) {
  nlohmann::json out;
  out["benchmark"] = "collectives";
  out["backend"] = f.backend;
  out["nproc"] = sweep.world;
  out["ranks_as"] = f.from_env ? "processes" : "threads";
  out["device"] = sweep.device_name;
  if (f.backend == "shm") out["shm_transport"] = sweep.shm_transport_name;
  out["dtype"] = "float32";
  out["definitions"] =
      "nccl-tests: algbw = S/time (GB/s = 1e9 B/s); busbw = algbw*(n-1)/n for all_gather "
      "(S = output) and reduce_scatter (S = input), algbw*2(n-1)/n for all_reduce, algbw for "
      "broadcast; time = mean per iteration of the slowest rank";
  out["memcpy"] = {{"bytes", memcpy_bytes},
                   {"GBps", memcpy_gbps},
                   {"what",
                    "host memcpy by one thread, best of 5, measured in this run: the "
                    "CPU-side limit for a rank's busbw"}};
  if (sweep.world == 1) out["note"] = "one rank: busbw is 0 by definition; algbw is a local copy";
  nlohmann::json results = nlohmann::json::array();
  for (const Row& r : sweep.rows) {
    const double algbw = r.bytes / r.seconds / 1e9;
    const double busbw = algbw * BusFactor(r.op, sweep.world);
    results.push_back({{"op", r.op},
                       {"bytes", r.bytes},
                       {"count", r.count},
                       {"iters", r.iters},
                       {"time_us", r.seconds * 1e6},
                       {"algbw_GBps", algbw},
                       {"busbw_GBps", busbw},
                       {"busbw_over_memcpy", busbw / memcpy_gbps}});
  }
  out["results"] = results;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Collectives bandwidth (algbw/busbw per op and size) as JSON; see the file's header.");
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<Flags> flags = ParseFlags();
  if (!flags.ok()) {
    std::fprintf(stderr, "%s\n", std::string(flags.status().message()).c_str());
    return 2;
  }
  const Flags& f = *flags;
  int64_t memcpy_bytes = 0;
  const double memcpy_gbps = MeasureMemcpyGBps(&memcpy_bytes);
  Sweep sweep;
  const absl::Status s = f.from_env ? RunFromEnv(f, &sweep) : RunThreads(f, &sweep);
  if (!s.ok()) {
    std::fprintf(stderr, "collectives_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  if (sweep.my_rank != 0) return 0;
  std::printf("%s\n", Report(f, sweep, memcpy_bytes, memcpy_gbps).dump(2).c_str());
  return 0;
}
