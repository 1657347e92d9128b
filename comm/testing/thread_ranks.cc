#include "comm/testing/thread_ranks.h"

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "core/status_macros.h"

namespace comm {
namespace testing {
namespace {

// Shared by the caller and the rank threads; a thread left behind after the deadline
// keeps it alive.
struct RunState {
  RankFunction fn;
  absl::Mutex mu;
  int finished ABSL_GUARDED_BY(mu) = 0;
  std::vector<bool> done ABSL_GUARDED_BY(mu);
  absl::Status first_error ABSL_GUARDED_BY(mu);
};

void RankMain(std::shared_ptr<RunState> state, std::shared_ptr<HashStore> store, int rank,
              int world_size, ThreadRanksOptions options) {
  RankContext ctx;
  ctx.rank = rank;
  ctx.world_size = world_size;
  ctx.store = store;
  ctx.allocator = std::make_shared<core::Allocator>(core::Device::Cpu());
  core::ScopedAllocator scope(ctx.allocator);
  absl::Status status;
  if (options.create_group) {
    absl::StatusOr<std::shared_ptr<GlooProcessGroup>> group =
        GlooProcessGroup::Create(store, rank, world_size, options.gloo);
    if (group.ok()) {
      ctx.group = *std::move(group);
    } else {
      status = group.status();
    }
  }
  if (status.ok()) status = state->fn(ctx);
  {
    absl::MutexLock lock(&state->mu);
    if (!status.ok() && state->first_error.ok()) {
      state->first_error = core::Annotate(status, absl::StrCat("rank ", rank));
    }
    state->done[rank] = true;
    ++state->finished;
    if (status.ok()) {
      // Keep the group until every rank is done or one failed, so no peer loses its
      // connections in the middle of a collective.
      auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
        return state->finished == world_size || !state->first_error.ok();
      };
      state->mu.Await(absl::Condition(&settled));
    }
  }
  ctx.group.reset();  // Closes this rank's connections.
}

}  // namespace

absl::Status RunThreadRanks(int world_size, RankFunction fn, const ThreadRanksOptions& options) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunThreadRanks: world_size must be at least 1, got ", world_size));
  }
  auto state = std::make_shared<RunState>();
  state->fn = std::move(fn);
  {
    absl::MutexLock lock(&state->mu);
    state->done.assign(world_size, false);
  }
  auto store = std::make_shared<HashStore>();
  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back(RankMain, state, store, r, world_size, options);
  }
  // Threads count as finished once their group is released too: wait for them to exit.
  bool all_done = false;
  std::vector<int> stuck;
  {
    absl::MutexLock lock(&state->mu);
    auto finished = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
      return state->finished == world_size;
    };
    all_done = state->mu.AwaitWithTimeout(absl::Condition(&finished), options.timeout);
    for (int r = 0; r < world_size; ++r) {
      if (!state->done[r]) stuck.push_back(r);
    }
  }
  if (!all_done) {
    for (std::thread& t : threads) t.detach();
    absl::MutexLock lock(&state->mu);
    std::string first = state->first_error.ok()
                            ? ""
                            : absl::StrCat("; first error: ", state->first_error.message());
    return absl::DeadlineExceededError(
        absl::StrCat("RunThreadRanks: ranks [", absl::StrJoin(stuck, ", "), "] of ", world_size,
                     " did not finish within ", absl::FormatDuration(options.timeout), first));
  }
  for (std::thread& t : threads) t.join();
  absl::MutexLock lock(&state->mu);
  return state->first_error;
}

}  // namespace testing
}  // namespace comm
