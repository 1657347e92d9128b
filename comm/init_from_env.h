// InitFromEnv: joins the job described by the environment that torchrun, our launcher
// (comm:launch) and common cluster launchers set, and returns the world group.
//
//   ASSIGN_OR_RETURN(comm::Distributed dist, comm::InitFromEnv(comm::InitOptions{}));
//   // dist.group->rank() == RANK, dist.group->size() == WORLD_SIZE
//   // dist.device: cuda:LOCAL_RANK for nccl, cpu for gloo
//
// Variables: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (required); LOCAL_RANK and
// LOCAL_WORLD_SIZE (optional, defaulting to RANK and WORLD_SIZE, i.e. one host);
// FSDP_JOB_SECRET (optional; our launcher sets one per job). Or Slurm's and Open MPI's, as
// NOTE [Launch environment] says.
//
// NOTE [Launch environment]: a process's place in the job (rank, world size, local rank,
// local world size) comes whole from the first of these sources whose rank variable is set:
//   1. torchrun's (and comm:launch's): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE;
//   2. Open MPI's (mpirun): OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE;
//   3. Slurm's (srun): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, and the tasks on this node
//      from SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE at SLURM_NODEID (InvalidArgument
//      naming both when they disagree).
// A launcher sets the first kind for each process it starts, so they win over the
// scheduler's, which then describe the launcher's own task (`srun torchrun ...`); mpirun
// inside a Slurm allocation starts its processes from daemons that inherit the node's
// SLURM_PROCID, so Open MPI's win over Slurm's. When the place comes from a scheduler, a
// torchrun variable set beside it (WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE without RANK)
// must agree with it, else InvalidArgument naming both. MASTER_ADDR defaults to the first
// host of SLURM_JOB_NODELIST (bracket ranges expanded) and MASTER_PORT to
// kSlurmPortBase + SLURM_JOB_ID % kSlurmPortSpan, so every task of a Slurm job agrees on
// them with nothing set by hand; set either to override.
// Rank 0 serves a TcpStore on MASTER_ADDR:MASTER_PORT (bound to that address); every
// rank connects to it, retrying until options.timeout, so ranks may start in any order.
// With FSDP_JOB_SECRET set, the store admits only processes that know it (a rank with
// another secret fails with PermissionDenied); unset, anyone reaching the port can use
// the store, as with torchrun.
//
// Backend: kAuto picks nccl on cuda:LOCAL_RANK when the build has CUDA and a device is
// usable, gloo on the CPU otherwise, and logs the choice. Asking for nccl where it is
// not available is FailedPrecondition, never a silent fallback to gloo. Gloo binds to
// the local address that routes to MASTER_ADDR (127.0.0.1 when MASTER_ADDR is
// loopback), so ranks on several hosts find each other with no further setting.
//
// kShm (never picked by kAuto) is the shared-memory CPU backend (comm/shm_process_group.h):
// it needs every rank on one host, so it is FailedPrecondition naming LOCAL_WORLD_SIZE
// and WORLD_SIZE unless they are equal; its device is the CPU.
//
// Like every comm entry point, all ranks must call it (NOTE [Same order on all ranks],
// comm/store.h). Keep the returned store alive as long as the group: on rank 0 it is
// the server the other ranks' stores talk to.
#ifndef COMM_INIT_FROM_ENV_H_
#define COMM_INIT_FROM_ENV_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/process_group.h"
#include "comm/store.h"
#include "core/device.h"

namespace comm {

// MASTER_PORT under Slurm when it is unset (NOTE [Launch environment]).
inline constexpr int kSlurmPortBase = 10000;
inline constexpr int kSlurmPortSpan = 20000;

// The launcher contract, as read from the environment.
struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  // FSDP_JOB_SECRET; empty when unset. Passed to the TcpStore (TcpStoreOptions.secret).
  std::string job_secret;
  // Where the place came from: "torchrun", "Open MPI" or "Slurm".
  std::string source = "torchrun";
};

// Reads the variables through `lookup` (nullopt when unset). InvalidArgument naming
// the variable when a required one is missing or a value is malformed or out of range,
// or naming both when two disagree (NOTE [Launch environment]).
absl::StatusOr<LaunchEnv> ParseLaunchEnv(
    const std::function<std::optional<std::string>(const std::string& name)>& lookup);

// ParseLaunchEnv over this process's environment.
absl::StatusOr<LaunchEnv> ReadLaunchEnv();

enum class Backend { kAuto, kGloo, kNccl, kShm };

// "auto", "gloo", "nccl", "shm" (and back); InvalidArgument for anything else.
absl::StatusOr<Backend> ParseBackend(absl::string_view name);
std::string BackendName(Backend backend);

struct InitOptions {
  Backend backend = Backend::kAuto;
  // Bound on connecting to the store and on meeting the other ranks.
  absl::Duration timeout = absl::Seconds(60);
  // Address gloo binds to; empty: the one that routes to MASTER_ADDR.
  std::string gloo_hostname;
  // Name of the world group (its store namespace).
  std::string group_name = "world";
};

// What InitFromEnv sets up.
struct Distributed {
  LaunchEnv env;
  Backend backend = Backend::kGloo;
  // Where this rank's collectives run: cpu for gloo and shm, cuda:i for nccl.
  core::Device device = core::Device::Cpu();
  std::shared_ptr<Store> store;
  std::shared_ptr<ProcessGroup> group;
};

// Joins the job described by `env` (see the top of this file).
absl::StatusOr<Distributed> InitFromLaunchEnv(const LaunchEnv& env, const InitOptions& options);

// ReadLaunchEnv, then InitFromLaunchEnv.
absl::StatusOr<Distributed> InitFromEnv(const InitOptions& options);

}  // namespace comm

#endif  // COMM_INIT_FROM_ENV_H_
