#include "comm/init_from_env.h"

#include <cstdlib>
#include <limits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "comm/gloo_process_group.h"
#include "comm/internal/slurm.h"
#include "comm/internal/socket.h"
#include "comm/shm_process_group.h"
#include "comm/tcp_store.h"
#include "core/cuda_device.h"
#include "core/status_macros.h"
#include "glog/logging.h"

#ifdef FSDP_WITH_CUDA
#include "comm/nccl_process_group.h"
#endif

namespace comm {
namespace {

absl::StatusOr<int> ReadInt(
    const std::function<std::optional<std::string>(const std::string&)>& lookup,
    const std::string& name, std::optional<int> fallback, int lo, int hi) {
  std::optional<std::string> v = lookup(name);
  if (!v.has_value()) {
    if (fallback.has_value()) return *fallback;
    return absl::InvalidArgumentError(
        absl::StrCat(name,
                     " is not set; start the job with a launcher (comm:launch, torchrun) that sets "
                     "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, or under srun or mpirun"));
  }
  int value = 0;
  if (!absl::SimpleAtoi(*v, &value) || value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "=\"", *v, "\" is not an integer in [", lo, ", ", hi, "]"));
  }
  return value;
}

}  // namespace

namespace {

using Lookup = std::function<std::optional<std::string>(const std::string&)>;

// Where a process's place in the job (rank, world size, local rank and size) comes from,
// in order of precedence (NOTE [Launch environment] in init_from_env.h).
struct PlaceSource {
  const char* name;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;  // null for Slurm (derived, see SlurmLocalWorldSize)
};
constexpr PlaceSource kTorchrun = {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                   "LOCAL_WORLD_SIZE"};
constexpr PlaceSource kOpenMpi = {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                  "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};
constexpr PlaceSource kSlurm = {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr};
constexpr int kMaxRanks = 1 << 20;

// Slurm's tasks on this node: SLURM_NTASKS_PER_NODE, or this node's (SLURM_NODEID) entry
// of SLURM_TASKS_PER_NODE; InvalidArgument naming both when both are set and disagree.
absl::StatusOr<std::optional<int>> SlurmLocalWorldSize(const Lookup& lookup, int world) {
  std::optional<int> per_node, from_list;
  if (lookup("SLURM_NTASKS_PER_NODE").has_value()) {
    ASSIGN_OR_RETURN(per_node, ReadInt(lookup, "SLURM_NTASKS_PER_NODE", std::nullopt, 1, world));
  }
  const std::optional<std::string> list = lookup("SLURM_TASKS_PER_NODE");
  if (list.has_value() && lookup("SLURM_NODEID").has_value()) {
    ASSIGN_OR_RETURN(std::vector<int> counts, internal::ExpandSlurmTasksPerNode(*list));
    ASSIGN_OR_RETURN(const int node, ReadInt(lookup, "SLURM_NODEID", std::nullopt, 0,
                                             static_cast<int>(counts.size()) - 1));
    from_list = counts[static_cast<size_t>(node)];
  }
  if (per_node.has_value() && from_list.has_value() && *per_node != *from_list) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SLURM_NTASKS_PER_NODE=", *per_node, " disagrees with SLURM_TASKS_PER_NODE=\"", *list,
        "\", whose entry for SLURM_NODEID=", *lookup("SLURM_NODEID"), " is ", *from_list));
  }
  return per_node.has_value() ? per_node : from_list;
}

// Reads the place from `source`, whose rank variable is set.
absl::StatusOr<LaunchEnv> ReadPlace(const Lookup& lookup, const PlaceSource& source) {
  LaunchEnv env;
  env.source = source.name;
  ASSIGN_OR_RETURN(env.world_size, ReadInt(lookup, source.world_size, std::nullopt, 1, kMaxRanks));
  ASSIGN_OR_RETURN(env.rank, ReadInt(lookup, source.rank, std::nullopt, 0, env.world_size - 1));
  std::optional<int> local_world;
  if (source.local_world_size != nullptr) {
    ASSIGN_OR_RETURN(local_world,
                     ReadInt(lookup, source.local_world_size, env.world_size, 1, env.world_size));
  } else {
    ASSIGN_OR_RETURN(local_world, SlurmLocalWorldSize(lookup, env.world_size));
  }
  env.local_world_size = local_world.value_or(env.world_size);
  ASSIGN_OR_RETURN(env.local_rank,
                   ReadInt(lookup, source.local_rank, env.rank, 0, env.local_world_size - 1));
  return env;
}

// When the place comes from a scheduler, a torchrun variable set beside it must agree.
absl::Status CheckTorchrunAgrees(const Lookup& lookup, const LaunchEnv& env,
                                 const PlaceSource& source) {
  const struct {
    const char* torchrun;
    const char* theirs;
    int value;
  } pairs[] = {{kTorchrun.world_size, source.world_size, env.world_size},
               {kTorchrun.local_rank, source.local_rank, env.local_rank},
               {kTorchrun.local_world_size,
                source.local_world_size != nullptr ? source.local_world_size
                                                   : "SLURM_NTASKS_PER_NODE / SLURM_TASKS_PER_NODE",
                env.local_world_size}};
  for (const auto& p : pairs) {
    const std::optional<std::string> v = lookup(p.torchrun);
    int value = 0;
    if (v.has_value() && (!absl::SimpleAtoi(*v, &value) || value != p.value)) {
      return absl::InvalidArgumentError(
          absl::StrCat(p.torchrun, "=\"", *v, "\" disagrees with ", p.theirs, " (", p.value,
                       "): RANK is not ", "set, so the job's ranks come from ", source.name,
                       "; unset ", p.torchrun, " or set RANK and WORLD_SIZE too"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LaunchEnv> ParseLaunchEnv(const Lookup& lookup) {
  const PlaceSource* source = nullptr;
  for (const PlaceSource* s : {&kTorchrun, &kOpenMpi, &kSlurm}) {
    if (lookup(s->rank).has_value()) {
      source = s;
      break;
    }
  }
  if (source == nullptr) {
    return absl::InvalidArgumentError(
        "RANK is not set; start the job with a launcher that sets RANK, WORLD_SIZE, "
        "MASTER_ADDR and MASTER_PORT (comm:launch, torchrun), or under srun (Slurm: "
        "SLURM_PROCID, SLURM_NTASKS) or mpirun (Open MPI: OMPI_COMM_WORLD_RANK, "
        "OMPI_COMM_WORLD_SIZE)");
  }
  ASSIGN_OR_RETURN(LaunchEnv env, ReadPlace(lookup, *source));
  if (source != &kTorchrun) RETURN_IF_ERROR(CheckTorchrunAgrees(lookup, env, *source));

  const std::optional<std::string> nodes = lookup("SLURM_JOB_NODELIST");
  std::optional<std::string> addr = lookup("MASTER_ADDR");
  if ((!addr.has_value() || addr->empty()) && nodes.has_value()) {
    ASSIGN_OR_RETURN(std::vector<std::string> hosts, internal::ExpandSlurmHostList(*nodes));
    addr = hosts.front();
  }
  if (!addr.has_value() || addr->empty()) {
    return absl::InvalidArgumentError(
        "MASTER_ADDR is not set; it names the host of rank 0, which serves the store (under "
        "Slurm it defaults to the first host of SLURM_JOB_NODELIST)");
  }
  env.master_addr = *addr;
  if (!lookup("MASTER_PORT").has_value() && lookup("SLURM_JOB_ID").has_value()) {
    ASSIGN_OR_RETURN(const int job, ReadInt(lookup, "SLURM_JOB_ID", std::nullopt, 0,
                                            std::numeric_limits<int>::max()));
    env.master_port = kSlurmPortBase + job % kSlurmPortSpan;
  } else {
    ASSIGN_OR_RETURN(env.master_port, ReadInt(lookup, "MASTER_PORT", std::nullopt, 1, 65535));
  }
  env.job_secret = lookup(kJobSecretEnv).value_or("");
  return env;
}

absl::StatusOr<LaunchEnv> ReadLaunchEnv() {
  return ParseLaunchEnv([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

absl::StatusOr<Backend> ParseBackend(absl::string_view name) {
  if (name == "auto") return Backend::kAuto;
  if (name == "gloo") return Backend::kGloo;
  if (name == "nccl") return Backend::kNccl;
  if (name == "shm") return Backend::kShm;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend \"", name, "\"; expected auto, gloo, nccl or shm"));
}

std::string BackendName(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
      return "auto";
    case Backend::kGloo:
      return "gloo";
    case Backend::kNccl:
      return "nccl";
    case Backend::kShm:
      return "shm";
  }
  return "unknown";
}

absl::StatusOr<Distributed> InitFromLaunchEnv(const LaunchEnv& env, const InitOptions& options) {
  Distributed dist;
  dist.env = env;
  const std::string who = absl::StrCat("InitFromEnv (rank ", env.rank, " of ", env.world_size, ")");

  // The backend, before any network traffic, so a wrong request fails alike on all ranks.
  absl::StatusOr<int> gpus = core::CudaDeviceCount();
  if (options.backend == Backend::kNccl && !gpus.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": backend nccl was asked for but no GPU is usable: ", gpus.status().message()));
  }
  dist.backend = options.backend;
  if (dist.backend == Backend::kAuto) {
    dist.backend = gpus.ok() ? Backend::kNccl : Backend::kGloo;
    // Logged only once the program has set up glog: the library writes no log line
    // before its caller's logging exists (glog would warn and write to stderr).
    LOG_IF(INFO, google::IsGoogleLoggingInitialized())
        << who << ": backend auto -> " << BackendName(dist.backend)
        << (gpus.ok() ? "" : absl::StrCat(" (", gpus.status().message(), ")"));
  }
  if (dist.backend == Backend::kNccl) {
    dist.device = core::Device::Cuda(env.local_rank % *gpus);
  }
  if (dist.backend == Backend::kShm && env.local_world_size != env.world_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": backend shm needs every rank on one host, but LOCAL_WORLD_SIZE is ",
        env.local_world_size, " and WORLD_SIZE is ", env.world_size, "; use gloo across hosts"));
  }

  TcpStoreOptions store_options;
  store_options.host = env.master_addr;
  store_options.port = env.master_port;
  store_options.is_server = env.rank == 0;
  store_options.connect_timeout = options.timeout;
  store_options.secret = env.job_secret;
  absl::StatusOr<std::shared_ptr<TcpStore>> store = TcpStore::Create(store_options);
  if (!store.ok()) return core::Annotate(store.status(), who);
  dist.store = *store;

  if (dist.backend == Backend::kGloo) {
    GlooOptions gloo;
    gloo.name = options.group_name;
    gloo.rendezvous_timeout = options.timeout;
    gloo.store_server_rank = 0;  // rank 0 serves the TcpStore
    gloo.hostname = options.gloo_hostname;
    if (gloo.hostname.empty()) {
      absl::StatusOr<std::string> local = internal::LocalAddressFor(env.master_addr);
      if (!local.ok()) {
        return core::Annotate(local.status(),
                              absl::StrCat(who,
                                           ": cannot find the local address that reaches "
                                           "MASTER_ADDR ",
                                           env.master_addr));
      }
      gloo.hostname = *local;
    }
    absl::StatusOr<std::shared_ptr<GlooProcessGroup>> group =
        GlooProcessGroup::Create(dist.store, env.rank, env.world_size, gloo);
    if (!group.ok()) return group.status();
    dist.group = *std::move(group);
    return dist;
  }
  if (dist.backend == Backend::kShm) {
    ShmOptions shm;
    shm.name = options.group_name;
    shm.rendezvous_timeout = options.timeout;
    absl::StatusOr<std::shared_ptr<ShmProcessGroup>> group =
        ShmProcessGroup::Create(dist.store, env.rank, env.world_size, shm);
    if (!group.ok()) return group.status();
    dist.group = *std::move(group);
    return dist;
  }
#ifdef FSDP_WITH_CUDA
  NcclOptions nccl;
  nccl.name = options.group_name;
  nccl.init_timeout = options.timeout;
  absl::StatusOr<std::shared_ptr<NcclProcessGroup>> group =
      NcclProcessGroup::Create(dist.store, env.rank, env.world_size, dist.device, nccl);
  if (!group.ok()) return group.status();
  dist.group = *std::move(group);
  return dist;
#else
  return absl::FailedPreconditionError(
      absl::StrCat(who, ": backend nccl needs a build with --config=cuda"));
#endif
}

absl::StatusOr<Distributed> InitFromEnv(const InitOptions& options) {
  absl::StatusOr<LaunchEnv> env = ReadLaunchEnv();
  if (!env.ok()) return env.status();
  return InitFromLaunchEnv(*env, options);
}

}  // namespace comm
