// Host (CPU) memory as the kernel and the container see it: total RAM and swap, the
// kernel's MemAvailable, and the cgroup memory limit of this process (cgroup v2
// memory.max / memory.current, or v1 memory.limit_in_bytes / memory.usage_in_bytes),
// so that a job can refuse up front to start something that would be OOM-killed.
//
//   ASSIGN_OR_RETURN(core::HostMemoryInfo info, core::ReadHostMemoryInfo());
//   int64_t free_now = info.Available();   // min(MemAvailable, cgroup headroom)
//   LOG(INFO) << info.Describe();
//
// Tests point HostMemoryPaths at files of their own.
#ifndef CORE_HOST_MEMORY_H_
#define CORE_HOST_MEMORY_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace core {

// Where ReadHostMemoryInfo looks; the defaults are the real files.
struct HostMemoryPaths {
  std::string meminfo = "/proc/meminfo";
  // This process's cgroup membership ("0::/path" for v2, "N:memory:/path" for v1).
  std::string self_cgroup = "/proc/self/cgroup";
  // The cgroup file system: v2 files directly under it, v1 under "<root>/memory".
  std::string cgroup_root = "/sys/fs/cgroup";
};

// One reading of the host's memory, in bytes.
struct HostMemoryInfo {
  int64_t mem_total = 0;      // MemTotal
  int64_t mem_available = 0;  // MemAvailable: what can be allocated without swapping
  int64_t swap_total = 0;     // SwapTotal
  // The tightest memory limit of this process's cgroup and its ancestors, its usage,
  // and the file it came from; unset when there is no limit (or no cgroup files).
  std::optional<int64_t> cgroup_limit;
  int64_t cgroup_usage = 0;
  std::string cgroup_limit_file;

  // What more this process can allocate now: MemAvailable, or less when the cgroup
  // limit leaves less headroom (limit - usage, at least 0).
  int64_t Available() const;
  // The most this process could ever hold: MemTotal + SwapTotal, or the cgroup limit
  // when that is smaller.
  int64_t Capacity() const;
  // "MemAvailable 21.3GiB of MemTotal 23.5GiB; cgroup limit 8.00GiB (usage 1.20GiB,
  // /sys/fs/cgroup/memory.max)".
  std::string Describe() const;
};

// Reads MemTotal, MemAvailable and SwapTotal from `meminfo` text (values in kB).
// InvalidArgument naming `source` and the missing or malformed field.
absl::StatusOr<HostMemoryInfo> ParseMeminfo(absl::string_view meminfo, absl::string_view source);

// ParseMeminfo of paths.meminfo plus the cgroup limit (the tightest along this process's
// cgroup path up to the root; a limit of "max" or >= 2^62 counts as none). NotFound or
// InvalidArgument naming the file when meminfo cannot be read or parsed; unreadable
// cgroup files only mean "no cgroup limit".
absl::StatusOr<HostMemoryInfo> ReadHostMemoryInfo(const HostMemoryPaths& paths = {});

// Capacity() of the real host, read once per process; 0 when it cannot be read.
int64_t HostMemoryCapacityBytes();

}  // namespace core

#endif  // CORE_HOST_MEMORY_H_
