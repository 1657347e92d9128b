#include "fsdp/internal/host_offload.h"

namespace fsdp {
namespace internal {
namespace {

bool& ThreadAllowed() {
  thread_local bool allowed = false;
  return allowed;
}

}  // namespace

bool SetHostOffloadOnCpuForThisThread(bool allowed) {
  const bool previous = ThreadAllowed();
  ThreadAllowed() = allowed;
  return previous;
}

bool HostOffloadOnCpuAllowed() { return ThreadAllowed(); }

}  // namespace internal
}  // namespace fsdp
