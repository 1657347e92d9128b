// Thread ranks: runs N ranks as threads of one test process, each with its own gloo
// ProcessGroup over one shared HashStore and its own CPU allocator, and reports the
// first error. After gloo's test/base_test.h; fsdp and other packages' multi-rank tests
// use it directly.
//
//   absl::Status s = comm::testing::RunThreadRanks(4, [](comm::testing::RankContext& ctx) {
//     core::Tensor t = core::Tensor::Zeros({8});
//     t.Fill(ctx.rank);
//     ASSIGN_OR_RETURN(auto work, ctx.group->AllReduce(t, comm::AllReduceOptions{}));
//     RETURN_IF_ERROR(work->Wait(absl::Seconds(30)));
//     int64_t peak = ctx.allocator->Stats().peak_total;   // this rank's memory only
//     return absl::OkStatus();
//   });
//   EXPECT_TRUE(s.ok()) << s;
//
// Each rank thread installs its allocator with core::ScopedAllocator before anything
// else, so tensors it allocates (and the group's temporaries) count there. The rank
// function's collectives must follow NOTE [Same order on all ranks] (comm/store.h).
// The whole run has a deadline; a rank still running after it is reported and left
// behind (its thread is detached), so state the rank function uses must outlive it:
// capture by value or through shared_ptr when a hang is possible.
#ifndef COMM_TESTING_THREAD_RANKS_H_
#define COMM_TESTING_THREAD_RANKS_H_

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/gloo_process_group.h"
#include "comm/hash_store.h"
#include "comm/process_group.h"
#include "core/allocator.h"

namespace comm {
namespace testing {

// What one rank thread gets.
struct RankContext {
  int rank = 0;
  int world_size = 0;
  // This rank's gloo group over all world_size ranks (name "world").
  std::shared_ptr<ProcessGroup> group;
  // This rank's CPU allocator, current on the rank thread for the whole run.
  std::shared_ptr<core::Allocator> allocator;
  // The store all ranks share (the group's keys are under "world/"), for tests that
  // build more groups or need their own rendezvous.
  std::shared_ptr<Store> store;
};

struct ThreadRanksOptions {
  // Deadline of the whole run (group creation included).
  absl::Duration timeout = absl::Seconds(60);
  // Options of each rank's world group (hostname, rendezvous timeout).
  GlooOptions gloo;
  // When false, ranks get no group (ctx.group is null) and make their own.
  bool create_group = true;
};

using RankFunction = std::function<absl::Status(RankContext& ctx)>;

// Runs `fn` on `world_size` rank threads and returns OK if every rank returned OK;
// otherwise the error that happened first, prefixed "rank <r>: " (same code). A rank
// that fails releases its group at once, so peers blocked on it fail fast instead of
// waiting for their timeouts; ranks that succeed keep theirs until all are done.
// DeadlineExceeded listing the unfinished ranks after options.timeout.
absl::Status RunThreadRanks(int world_size, RankFunction fn,
                            const ThreadRanksOptions& options = ThreadRanksOptions());

}  // namespace testing
}  // namespace comm

#endif  // COMM_TESTING_THREAD_RANKS_H_
