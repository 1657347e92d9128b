// Test-only: lets FullyShardOptions::cpu_offload run on CPU parameters, so that the CPU
// build tests the offload logic (NOTE [CPU offload] in fsdp/options.h) end to end. The
// shards then live in the pinned host allocator's memory (core::Allocator::PinnedHost(),
// ordinary host memory without CUDA, counted apart from the rank's CPU allocator) and the
// copies that are host <-> device on a GPU are host copies; everything else is the code
// path a CUDA unit takes. Production code never sets it; the check is one thread-local
// read.
//
//   fsdp::internal::SetHostOffloadOnCpuForThisThread(true);   // each rank thread
//   ... FullyShard(model, group, options_with_cpu_offload, &registry) ...
//   fsdp::internal::SetHostOffloadOnCpuForThisThread(false);
#ifndef FSDP_INTERNAL_HOST_OFFLOAD_H_
#define FSDP_INTERNAL_HOST_OFFLOAD_H_

namespace fsdp {
namespace internal {

// Allows (true) or refuses again (false) cpu_offload for CPU parameters in FullyShard
// calls made on the calling thread; returns the previous setting.
bool SetHostOffloadOnCpuForThisThread(bool allowed);

// Whether the calling thread allows it.
bool HostOffloadOnCpuAllowed();

}  // namespace internal
}  // namespace fsdp

#endif  // FSDP_INTERNAL_HOST_OFFLOAD_H_
