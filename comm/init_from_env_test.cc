#include "comm/init_from_env.h"

#include <map>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/internal/socket.h"
#include "comm/tcp_store.h"
#include "core/cuda_device.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace comm {
namespace {

std::function<std::optional<std::string>(const std::string&)> Env(
    std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(ParseLaunchEnvTest, ReadsTheTorchrunVariables) {
  auto env = ParseLaunchEnv(Env({{"RANK", "5"},
                                 {"WORLD_SIZE", "8"},
                                 {"LOCAL_RANK", "1"},
                                 {"LOCAL_WORLD_SIZE", "4"},
                                 {"MASTER_ADDR", "node0"},
                                 {"MASTER_PORT", "29500"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 5);
  EXPECT_EQ(env->world_size, 8);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->local_world_size, 4);
  EXPECT_EQ(env->master_addr, "node0");
  EXPECT_EQ(env->master_port, 29500);
}

TEST(ParseLaunchEnvTest, ReadsTheJobSecretWhenSet) {
  const std::map<std::string, std::string> base = {
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}};
  EXPECT_EQ(ParseLaunchEnv(Env(base)).value().job_secret, "");
  auto with = base;
  with["FSDP_JOB_SECRET"] = "s3cret";
  EXPECT_EQ(ParseLaunchEnv(Env(with)).value().job_secret, "s3cret");
}

TEST(ParseLaunchEnvTest, LocalVariablesDefaultToOneHost) {
  auto env = ParseLaunchEnv(
      Env({{"RANK", "2"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->local_rank, 2);
  EXPECT_EQ(env->local_world_size, 3);
}

TEST(ParseLaunchEnvTest, ErrorsNameTheVariable) {
  const std::map<std::string, std::string> good = {
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}};
  struct Case {
    std::string var, value;  // value "" means: unset it
  };
  for (const Case& c : std::vector<Case>{{"RANK", ""},
                                         {"RANK", "2"},
                                         {"RANK", "x"},
                                         {"WORLD_SIZE", "0"},
                                         {"MASTER_ADDR", ""},
                                         {"MASTER_PORT", "65536"},
                                         {"LOCAL_RANK", "-1"}}) {
    auto vars = good;
    if (c.value.empty()) {
      vars.erase(c.var);
    } else {
      vars[c.var] = c.value;
    }
    auto env = ParseLaunchEnv(Env(vars));
    EXPECT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument) << c.var << "=" << c.value;
    // The message opens with the variable and its value, so "RANK" inside "LOCAL_RANK"
    // (or inside the hint that lists the variables a launcher sets) does not count.
    const std::string opening = c.value.empty() ? absl::StrCat(c.var, " is not set")
                                                : absl::StrCat(c.var, "=\"", c.value, "\"");
    EXPECT_TRUE(absl::StartsWith(env.status().message(), opening))
        << "wanted \"" << opening << "...\", got: " << env.status();
  }
}

// NOTE [Launch environment]: under srun, with nothing set by hand.
TEST(ParseLaunchEnvTest, ReadsSlurmsVariables) {
  auto env = ParseLaunchEnv(Env({{"SLURM_PROCID", "5"},
                                 {"SLURM_NTASKS", "8"},
                                 {"SLURM_LOCALID", "1"},
                                 {"SLURM_TASKS_PER_NODE", "4(x2)"},
                                 {"SLURM_NODEID", "1"},
                                 {"SLURM_JOB_NODELIST", "gpu[07-08]"},
                                 {"SLURM_JOB_ID", "123456"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->source, "Slurm");
  EXPECT_EQ(env->rank, 5);
  EXPECT_EQ(env->world_size, 8);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->local_world_size, 4);
  EXPECT_EQ(env->master_addr, "gpu07");
  EXPECT_EQ(env->master_port, kSlurmPortBase + 123456 % kSlurmPortSpan);

  // MASTER_ADDR and MASTER_PORT override what Slurm gives; SLURM_NTASKS_PER_NODE counts.
  auto set = ParseLaunchEnv(Env({{"SLURM_PROCID", "0"},
                                 {"SLURM_NTASKS", "2"},
                                 {"SLURM_NTASKS_PER_NODE", "1"},
                                 {"SLURM_JOB_NODELIST", "a,b"},
                                 {"SLURM_JOB_ID", "7"},
                                 {"MASTER_ADDR", "head"},
                                 {"MASTER_PORT", "29500"}}));
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->local_world_size, 1);
  EXPECT_EQ(set->master_addr, "head");
  EXPECT_EQ(set->master_port, 29500);
}

TEST(ParseLaunchEnvTest, ReadsOpenMpisVariables) {
  auto env = ParseLaunchEnv(Env({{"OMPI_COMM_WORLD_RANK", "3"},
                                 {"OMPI_COMM_WORLD_SIZE", "4"},
                                 {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                 {"MASTER_ADDR", "h"},
                                 {"MASTER_PORT", "29500"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->source, "Open MPI");
  EXPECT_EQ(env->rank, 3);
  EXPECT_EQ(env->world_size, 4);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->local_world_size, 2);
  // mpirun gives no master host: without MASTER_ADDR (and no Slurm host list) it is named.
  auto no_addr = ParseLaunchEnv(
      Env({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"MASTER_PORT", "1"}}));
  EXPECT_EQ(no_addr.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(no_addr.status().message(), "MASTER_ADDR is not set"))
      << no_addr.status();
}

// torchrun's variables beat the schedulers' (srun torchrun: SLURM_PROCID is the node's
// task), and Open MPI's beat Slurm's (mpirun inside an allocation).
TEST(ParseLaunchEnvTest, PrecedenceIsTorchrunThenOpenMpiThenSlurm) {
  const std::map<std::string, std::string> slurm = {{"SLURM_PROCID", "1"},
                                                    {"SLURM_NTASKS", "2"},
                                                    {"SLURM_JOB_NODELIST", "n[1-2]"},
                                                    {"SLURM_JOB_ID", "99"}};
  auto with_mpi = slurm;
  with_mpi.insert({{"OMPI_COMM_WORLD_RANK", "6"}, {"OMPI_COMM_WORLD_SIZE", "16"}});
  auto mpi = ParseLaunchEnv(Env(with_mpi));
  ASSERT_TRUE(mpi.ok()) << mpi.status();
  EXPECT_EQ(mpi->source, "Open MPI");
  EXPECT_EQ(mpi->rank, 6);
  EXPECT_EQ(mpi->world_size, 16);
  EXPECT_EQ(mpi->master_addr, "n1");  // the Slurm host list still names the master
  auto with_torchrun = with_mpi;
  with_torchrun.insert({{"RANK", "11"}, {"WORLD_SIZE", "12"}});
  auto torchrun = ParseLaunchEnv(Env(with_torchrun));
  ASSERT_TRUE(torchrun.ok()) << torchrun.status();
  EXPECT_EQ(torchrun->source, "torchrun");
  EXPECT_EQ(torchrun->rank, 11);
  EXPECT_EQ(torchrun->world_size, 12);
}

// Disagreements are InvalidArgument naming both sides.
TEST(ParseLaunchEnvTest, DisagreeingVariablesAreNamed) {
  auto mixed = ParseLaunchEnv(Env({{"SLURM_PROCID", "0"},
                                   {"SLURM_NTASKS", "4"},
                                   {"WORLD_SIZE", "8"},
                                   {"MASTER_ADDR", "h"},
                                   {"MASTER_PORT", "1"}}));
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(mixed.status().message(),
                               "WORLD_SIZE=\"8\" disagrees with "
                               "SLURM_NTASKS (4)"))
      << mixed.status();
  auto per_node = ParseLaunchEnv(Env({{"SLURM_PROCID", "0"},
                                      {"SLURM_NTASKS", "8"},
                                      {"SLURM_NTASKS_PER_NODE", "4"},
                                      {"SLURM_TASKS_PER_NODE", "2(x4)"},
                                      {"SLURM_NODEID", "0"},
                                      {"MASTER_ADDR", "h"},
                                      {"MASTER_PORT", "1"}}));
  EXPECT_EQ(per_node.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(per_node.status().message().find("SLURM_NTASKS_PER_NODE=4 disagrees with "
                                             "SLURM_TASKS_PER_NODE=\"2(x4)\""),
            std::string::npos)
      << per_node.status();
  auto bad_list = ParseLaunchEnv(Env({{"SLURM_PROCID", "0"},
                                      {"SLURM_NTASKS", "2"},
                                      {"SLURM_JOB_NODELIST", "n[2-1]"},
                                      {"MASTER_PORT", "1"}}));
  EXPECT_EQ(bad_list.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_list.status().message().find("SLURM_JOB_NODELIST"), std::string::npos);
  auto no_source = ParseLaunchEnv(Env({{"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}));
  EXPECT_NE(no_source.status().message().find("srun"), std::string::npos) << no_source.status();
  EXPECT_NE(no_source.status().message().find("mpirun"), std::string::npos);
}

TEST(ParseBackendTest, Names) {
  EXPECT_EQ(ParseBackend("gloo").value(), Backend::kGloo);
  EXPECT_EQ(ParseBackend("nccl").value(), Backend::kNccl);
  EXPECT_EQ(ParseBackend("auto").value(), Backend::kAuto);
  EXPECT_EQ(ParseBackend("mpi").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseBackend("shm").value(), Backend::kShm);
  EXPECT_EQ(BackendName(Backend::kNccl), "nccl");
  EXPECT_EQ(BackendName(Backend::kShm), "shm");
  EXPECT_NE(ParseBackend("mpi").status().message().find("shm"), std::string::npos);
}

LaunchEnv EnvFor(int rank, int world, int port, const std::string& secret = "") {
  LaunchEnv env;
  env.job_secret = secret;
  env.rank = rank;
  env.world_size = world;
  env.local_rank = rank;
  env.local_world_size = world;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  return env;
}

// Three rank threads join through InitFromLaunchEnv with `backend` and all-reduce.
void MeetAndAllReduce(Backend backend) {
  const int port = internal::PickFreePort().value();
  constexpr int kWorld = 3;
  std::vector<absl::Status> results(kWorld);
  std::vector<std::thread> threads;
  for (int r = kWorld - 1; r >= 0; --r) {  // rank 0 (the server) starts last
    threads.emplace_back([&, r] {
      InitOptions o;
      o.backend = backend;
      o.timeout = absl::Seconds(20);
      absl::StatusOr<Distributed> d = InitFromLaunchEnv(EnvFor(r, kWorld, port, "job secret"), o);
      if (!d.ok()) {
        results[r] = d.status();
        return;
      }
      EXPECT_EQ(d->group->rank(), r);
      EXPECT_EQ(d->group->size(), kWorld);
      EXPECT_EQ(d->backend, backend);
      EXPECT_EQ(d->group->backend_name(), BackendName(backend));
      EXPECT_TRUE(d->device.is_cpu());
      core::Tensor t = core::Tensor::Zeros({4});
      t.Fill(static_cast<float>(r + 1));
      auto work = d->group->AllReduce(t, AllReduceOptions{});
      results[r] = work.ok() ? (*work)->Wait(absl::Seconds(20)) : work.status();
      if (results[r].ok()) {
        // Every element: 4 elements over 3 ranks split unevenly into chunks.
        EXPECT_EQ(t.ToVector(), std::vector<float>(4, 1 + 2 + 3)) << "rank " << r;
      }
      // Everyone finishes before rank 0's store server goes away.
      auto bar = d->group->Barrier(BarrierOptions{});
      if (results[r].ok()) results[r] = bar.ok() ? (*bar)->Wait(absl::Seconds(20)) : bar.status();
    });
    if (r == kWorld - 1) absl::SleepFor(absl::Milliseconds(200));
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r)
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

TEST(InitFromLaunchEnvTest, RanksMeetOverTcpStoreAndAllReduce) { MeetAndAllReduce(Backend::kGloo); }

TEST(InitFromLaunchEnvTest, ShmRanksMeetOverTcpStoreAndAllReduce) {
  MeetAndAllReduce(Backend::kShm);
}

TEST(InitFromLaunchEnvTest, ShmAcrossHostsIsFailedPreconditionNamingTheSizes) {
  InitOptions o;
  o.backend = Backend::kShm;
  o.timeout = absl::Seconds(2);
  LaunchEnv env = EnvFor(0, 4, internal::PickFreePort().value());
  env.local_world_size = 2;  // two hosts of two ranks
  const absl::Time start = absl::Now();
  auto d = InitFromLaunchEnv(env, o);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition) << d.status();
  EXPECT_NE(d.status().message().find("LOCAL_WORLD_SIZE is 2"), std::string::npos) << d.status();
  EXPECT_NE(d.status().message().find("WORLD_SIZE is 4"), std::string::npos) << d.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "refused only after waiting";
}

TEST(InitFromLaunchEnvTest, ARankWithAnotherJobSecretIsPermissionDeniedAtOnce) {
  TcpStoreOptions server;
  server.is_server = true;
  server.secret = "the job's secret";
  std::shared_ptr<TcpStore> store = TcpStore::Create(server).value();
  for (const std::string& secret : {std::string("another secret"), std::string()}) {
    InitOptions o;
    o.backend = Backend::kGloo;
    o.timeout = absl::Seconds(20);
    const absl::Time start = absl::Now();
    auto d = InitFromLaunchEnv(EnvFor(1, 2, store->port(), secret), o);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kPermissionDenied) << d.status();
    EXPECT_NE(d.status().message().find("rank 1 of 2"), std::string::npos) << d.status();
    EXPECT_NE(d.status().message().find("FSDP_JOB_SECRET"), std::string::npos) << d.status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "retried instead of refusing";
  }
}

TEST(InitFromLaunchEnvTest, NcclWithoutAGpuIsFailedPreconditionNotAFallback) {
  if (core::CudaDeviceCount().ok()) GTEST_SKIP() << "a GPU is present; nothing to refuse";
  InitOptions o;
  o.backend = Backend::kNccl;
  auto d = InitFromLaunchEnv(EnvFor(0, 1, internal::PickFreePort().value()), o);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition) << d.status();
  EXPECT_NE(d.status().message().find("nccl"), std::string::npos) << d.status();
}

TEST(InitFromLaunchEnvTest, AutoPicksGlooWithoutAGpu) {
  if (core::CudaDeviceCount().ok()) GTEST_SKIP() << "a GPU is present; auto picks nccl";
  InitOptions o;
  o.timeout = absl::Seconds(10);
  auto d = InitFromLaunchEnv(EnvFor(0, 1, internal::PickFreePort().value()), o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->backend, Backend::kGloo);
  EXPECT_EQ(d->group->backend_name(), "gloo");
}

TEST(InitFromLaunchEnvTest, MissingServerIsDeadlineExceededWithinTheTimeout) {
  InitOptions o;
  o.backend = Backend::kGloo;
  o.timeout = absl::Milliseconds(500);
  const absl::Time start = absl::Now();
  auto d = InitFromLaunchEnv(EnvFor(1, 2, internal::PickFreePort().value()), o);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDeadlineExceeded) << d.status();
  EXPECT_NE(d.status().message().find("rank 1 of 2"), std::string::npos) << d.status();
  // 500 ms of retries plus at most one 1 s backoff step, with slack for load.
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace comm
