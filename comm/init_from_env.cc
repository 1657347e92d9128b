#include "comm/init_from_env.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "comm/gloo_process_group.h"
#include "comm/shm_process_group.h"
#include "comm/internal/socket.h"
#include "comm/tcp_store.h"
#include "core/cuda_device.h"
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
    return absl::InvalidArgumentError(absl::StrCat(
        name, " is not set; start the job with a launcher (comm:launch, torchrun) that sets "
              "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"));
  }
  int value = 0;
  if (!absl::SimpleAtoi(*v, &value) || value < lo || value > hi) {
    return absl::InvalidArgumentError(absl::StrCat(name, "=\"", *v,
                                                   "\" is not an integer in [", lo, ", ", hi, "]"));
  }
  return value;
}

}  // namespace

absl::StatusOr<LaunchEnv> ParseLaunchEnv(
    const std::function<std::optional<std::string>(const std::string& name)>& lookup) {
  LaunchEnv env;
  constexpr int kMax = 1 << 20;
  absl::StatusOr<int> world = ReadInt(lookup, "WORLD_SIZE", std::nullopt, 1, kMax);
  if (!world.ok()) return world.status();
  env.world_size = *world;
  absl::StatusOr<int> rank = ReadInt(lookup, "RANK", std::nullopt, 0, env.world_size - 1);
  if (!rank.ok()) return rank.status();
  env.rank = *rank;
  absl::StatusOr<int> local_world =
      ReadInt(lookup, "LOCAL_WORLD_SIZE", env.world_size, 1, env.world_size);
  if (!local_world.ok()) return local_world.status();
  env.local_world_size = *local_world;
  absl::StatusOr<int> local_rank =
      ReadInt(lookup, "LOCAL_RANK", env.rank, 0, env.local_world_size - 1);
  if (!local_rank.ok()) return local_rank.status();
  env.local_rank = *local_rank;
  std::optional<std::string> addr = lookup("MASTER_ADDR");
  if (!addr.has_value() || addr->empty()) {
    return absl::InvalidArgumentError(
        "MASTER_ADDR is not set; it names the host of rank 0, which serves the store");
  }
  env.master_addr = *addr;
  absl::StatusOr<int> port = ReadInt(lookup, "MASTER_PORT", std::nullopt, 1, 65535);
  if (!port.ok()) return port.status();
  env.master_port = *port;
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
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": backend nccl was asked for but no GPU is usable: ",
                     gpus.status().message()));
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
        env.local_world_size, " and WORLD_SIZE is ", env.world_size,
        "; use gloo across hosts"));
  }

  TcpStoreOptions store_options;
  store_options.host = env.master_addr;
  store_options.port = env.master_port;
  store_options.is_server = env.rank == 0;
  store_options.connect_timeout = options.timeout;
  store_options.secret = env.job_secret;
  absl::StatusOr<std::shared_ptr<TcpStore>> store = TcpStore::Create(store_options);
  if (!store.ok()) {
    return absl::Status(store.status().code(), absl::StrCat(who, ": ", store.status().message()));
  }
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
        return absl::Status(local.status().code(),
                            absl::StrCat(who, ": cannot find the local address that reaches "
                                              "MASTER_ADDR ", env.master_addr, ": ",
                                         local.status().message()));
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
