// The rendezvous of a ShmProcessGroup (comm/shm_process_group.h): rank 0 creates the
// segment and publishes its name in the store, the others attach to it, rank 0 unlinks
// it once all have (NOTE [Attach errors] in the .cc), and then every rank probes
// cross-memory attach and all agree on the transport.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<ShmSegment> segment,
//                    JoinShmSegment(store, rank, size, options, who, deadline));
//   ASSIGN_OR_RETURN(bool cma, ChooseShmTransport(store, *segment, rank, size, options,
//                                                 who, deadline));
//
// Both follow NOTE [Same order on all ranks]; `store` is the group's namespace and
// `who` names the group in errors ("shm group 'world' (rank 1 of 4)"). Private to the
// shm_process_group library.
#ifndef COMM_INTERNAL_SHM_RENDEZVOUS_H_
#define COMM_INTERNAL_SHM_RENDEZVOUS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/internal/shm_segment.h"
#include "comm/shm_options.h"
#include "comm/store.h"

namespace comm {
namespace internal {

// The group's segment, mapped, with this rank's control block initialised, once every
// rank has attached (and rank 0 has unlinked its name). The errors of
// ShmProcessGroup::Create: Unavailable when the segment cannot be created or opened,
// ResourceExhausted when /dev/shm cannot hold it, FailedPrecondition for a segment that
// does not match (or a rank that could not attach, on every rank at once),
// DeadlineExceeded naming the ranks that did not arrive by `deadline`, DataLoss for a
// segment name rank 0 would not write.
absl::StatusOr<std::unique_ptr<ShmSegment>> JoinShmSegment(Store& store, int rank, int size,
                                                           const ShmOptions& options,
                                                           const std::string& who,
                                                           absl::Time deadline);

// Whether the group moves its bulk data through cross-memory attach, the same answer
// on every rank: each rank probes process_vm_readv of every peer (or calls
// options.probe_override) and publishes the result; options.transport then decides.
// FailedPrecondition when the ranks pass different transports, or kCrossMemoryAttach
// when some rank cannot read some peer (naming both and the errno).
absl::StatusOr<bool> ChooseShmTransport(Store& store, const ShmSegment& segment, int rank, int size,
                                        const ShmOptions& options, const std::string& who,
                                        absl::Time deadline);

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_SHM_RENDEZVOUS_H_
