// A rank program for the multi-process comm tests: joins the job from the launcher's
// environment (comm::InitFromEnv over TcpStore; gloo, or shm with --backend=shm) and
// runs one scenario.
//
//   launch --nproc=4 -- comm_worker --mode=collectives
//   launch --nproc=4 -- comm_worker --mode=die --backend=shm
//
// Modes:
//   collectives  every collective with checked results; prints "ok" and exits 0.
//   never_join   the last rank never joins; the others must get DeadlineExceeded from
//                InitFromEnv within --timeout_s and exit 3.
//   die          rank 1 kills itself (SIGKILL) after two all-reduces; the others must
//                get an error from their next collective and exit 4.
// In the fault modes the reporting ranks ignore SIGTERM, so that the launcher's
// SIGTERM (sent as soon as the first rank fails) does not cut short the error report
// each of them must print; the launcher's SIGKILL after its grace period still applies.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/gloo_process_group.h"
#include "comm/init_from_env.h"
#include "comm/shm_process_group.h"
#include "core/status_macros.h"
#include "core/tensor.h"

ABSL_FLAG(std::string, mode, "collectives", "the scenario: collectives, never_join or die");
ABSL_FLAG(double, timeout_s, 20, "InitFromEnv's timeout, seconds (> 0)");
ABSL_FLAG(std::string, backend, "gloo", "the collective backend: gloo or shm");

namespace {

constexpr absl::Duration kCollectiveTimeout = absl::Seconds(20);

void Say(int rank, const std::string& text) {
  std::printf("worker %d: %s\n", rank, text.c_str());
  std::fflush(stdout);
}

absl::Status Expect(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(absl::StrCat("check failed: ", what));
}

absl::Status Finish(absl::StatusOr<std::shared_ptr<comm::Work>> work) {
  if (!work.ok()) return work.status();
  return (*work)->Wait(kCollectiveTimeout);
}

absl::Status RunCollectives(comm::ProcessGroup& g) {
  const int n = g.size(), r = g.rank();
  // All-gather, two sizes.
  for (int64_t k : {5, 1000}) {
    core::Tensor in = core::Tensor::Empty({k});
    for (int64_t i = 0; i < k; ++i) in.data<float>()[i] = static_cast<float>(r * 10000 + i);
    core::Tensor out = core::Tensor::Zeros({n * k});
    RETURN_IF_ERROR(Finish(g.AllGather(in, out, comm::AllGatherOptions{})));
    for (int q = 0; q < n; ++q) {
      RETURN_IF_ERROR(Expect(out.data<float>()[q * k + k - 1] == q * 10000 + k - 1, "AllGather"));
    }
  }
  // Reduce-scatter (average) of rank+1 everywhere: (1 + ... + n) / n.
  core::Tensor rs_in = core::Tensor::Zeros({n * 7});
  rs_in.Fill(static_cast<float>(r + 1));
  core::Tensor rs_out = core::Tensor::Zeros({7});
  comm::ReduceScatterOptions avg;
  avg.reduce_op = comm::ReduceOp::kAverage;
  RETURN_IF_ERROR(Finish(g.ReduceScatter(rs_in, rs_out, avg)));
  RETURN_IF_ERROR(Expect(rs_out.ToVector()[6] == static_cast<float>(n * (n + 1) / 2) / n,
                         "ReduceScatter average"));
  // All-reduce: bf16 sum and fp32 max.
  core::Tensor bf = core::Tensor::Zeros({33}, core::DType::kBFloat16);
  bf.Fill(static_cast<float>(r + 1));
  RETURN_IF_ERROR(Finish(g.AllReduce(bf, comm::AllReduceOptions{})));
  RETURN_IF_ERROR(Expect(bf.ToVector()[32] == n * (n + 1) / 2, "AllReduce bf16 sum"));
  core::Tensor mx = core::Tensor::Zeros({3});
  mx.Fill(static_cast<float>(r));
  comm::AllReduceOptions max;
  max.reduce_op = comm::ReduceOp::kMax;
  RETURN_IF_ERROR(Finish(g.AllReduce(mx, max)));
  RETURN_IF_ERROR(Expect(mx.ToVector()[0] == n - 1, "AllReduce max"));
  // Broadcast from the last rank.
  core::Tensor b = core::Tensor::Zeros({9});
  b.Fill(static_cast<float>(r));
  comm::BroadcastOptions from_last;
  from_last.root = n - 1;
  RETURN_IF_ERROR(Finish(g.Broadcast(b, from_last)));
  RETURN_IF_ERROR(Expect(b.ToVector()[8] == n - 1, "Broadcast"));
  RETURN_IF_ERROR(Finish(g.Barrier(comm::BarrierOptions{})));
  // One all-gather of 4000 bytes per rank moved 4000 (n-1) bytes each way.
  const comm::CommStats stats = g.Stats();
  RETURN_IF_ERROR(Expect(stats.of(comm::CollectiveKind::kAllGather).calls == 2, "calls"));
  RETURN_IF_ERROR(
      Expect(stats.of(comm::CollectiveKind::kAllGather).bytes_received == (5 + 1000) * 4 * (n - 1),
             "AllGather bytes"));
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("A rank of the multi-process comm tests: comm_worker --mode=MODE");
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    std::fprintf(stderr, "comm_worker: unexpected argument %s\n", positional[1]);
    return 2;
  }
  const std::string mode = absl::GetFlag(FLAGS_mode);
  const double timeout_s = absl::GetFlag(FLAGS_timeout_s);
  if (mode != "collectives" && mode != "never_join" && mode != "die") {
    std::fprintf(stderr, "comm_worker: unknown --mode=%s (collectives, never_join, die)\n",
                 mode.c_str());
    return 2;
  }
  const std::string backend_name = absl::GetFlag(FLAGS_backend);
  if (backend_name != "gloo" && backend_name != "shm") {
    std::fprintf(stderr, "comm_worker: unknown --backend=%s (gloo, shm)\n", backend_name.c_str());
    return 2;
  }
  if (!(timeout_s > 0)) {
    std::fprintf(stderr, "comm_worker: --timeout_s must be > 0, got %g\n", timeout_s);
    return 2;
  }
  absl::StatusOr<comm::LaunchEnv> env = comm::ReadLaunchEnv();
  if (!env.ok()) {
    std::fprintf(stderr, "comm_worker: %s\n", std::string(env.status().message()).c_str());
    return 2;
  }
  const int rank = env->rank;
  if (mode == "never_join" && rank == env->world_size - 1) {
    Say(rank, "not joining");
    absl::SleepFor(absl::Seconds(60));
    return 0;
  }
  if (mode != "collectives") ::signal(SIGTERM, SIG_IGN);

  comm::InitOptions options;
  options.backend = backend_name == "shm" ? comm::Backend::kShm : comm::Backend::kGloo;
  options.timeout = absl::Seconds(timeout_s);
  const absl::Time start = absl::Now();
  absl::StatusOr<comm::Distributed> dist = comm::InitFromLaunchEnv(*env, options);
  if (!dist.ok()) {
    Say(rank, absl::StrCat("init failed after ", absl::FormatDuration(absl::Now() - start), ": ",
                           dist.status().ToString()));
    return 3;
  }
  auto* gloo = dynamic_cast<comm::GlooProcessGroup*>(dist->group.get());
  auto* shm = dynamic_cast<comm::ShmProcessGroup*>(dist->group.get());
  Say(rank, absl::StrCat("joined ", dist->group->Describe(), " on ",
                         gloo != nullptr  ? gloo->hostname()
                         : shm != nullptr ? shm->segment_name()
                                          : "?"));
  if (mode == "collectives") {
    absl::Status s = RunCollectives(*dist->group);
    if (!s.ok()) {
      Say(rank, absl::StrCat("FAILED: ", s.ToString()));
      return 1;
    }
    Say(rank, "ok");
    return 0;
  }
  if (mode == "die") {
    // 256 KiB: above ShmOptions.cma_min_bytes, so shm moves it by cross-memory attach.
    core::Tensor t = core::Tensor::Zeros({int64_t{1} << 16});
    for (int i = 0; i < 50; ++i) {
      if (rank == 1 && i == 2) {
        Say(rank, "dying now");
        ::raise(SIGKILL);
      }
      const absl::Time t0 = absl::Now();
      absl::Status s = Finish(dist->group->AllReduce(t, comm::AllReduceOptions{}));
      if (!s.ok()) {
        Say(rank, absl::StrCat("collective ", i, " failed after ",
                               absl::FormatDuration(absl::Now() - t0), ": ", s.ToString()));
        return 4;
      }
    }
    Say(rank, "ok (unexpected: no failure seen)");
    return 0;
  }
  Say(rank, absl::StrCat("unknown mode ", mode));
  return 2;
}
