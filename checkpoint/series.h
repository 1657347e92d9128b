// A series of checkpoints of one run under one root directory, one per saved step:
// <root>/step-<step, 9 digits> (NOTE [Periodic checkpoints] in integration/stage_options.h
// saves them). Each is a checkpoint::Save directory, so it exists under its name only once
// committed; the newest complete one is where a run resumes.
//
//   const std::string dir = checkpoint::StepDirectory("/ckpt/run", 1200);  // .../step-000001200
//   ASSIGN_OR_RETURN(checkpoint::LatestCheckpoint latest,
//                    checkpoint::FindLatestCheckpoint("/ckpt/run"));
//   for (const std::string& why : latest.skipped) LOG(WARNING) << why;
//   RETURN_IF_ERROR(checkpoint::PruneStepCheckpoints("/ckpt/run", /*keep=*/3).status());
#ifndef CHECKPOINT_SERIES_H_
#define CHECKPOINT_SERIES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace checkpoint {

// "<root>/step-<step>", the step zero-padded to 9 digits (wider steps print in full).
std::string StepDirectory(const std::string& root, int64_t step);

// The step directories under `root` (names "step-" and digits only: a save's temporary
// or aside directories and other files are not listed), ascending by step; empty when
// `root` does not exist. Errors naming `root` when it cannot be read.
absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> ListStepCheckpoints(
    const std::string& root);

struct LatestCheckpoint {
  std::string dir;   // the checkpoint to load
  int64_t step = 0;  // the step it recorded (CheckpointInfo::step)
  // The newer step directories passed over, each "<dir>: <why>" (a damaged metadata file,
  // a data file that is missing, truncated or fails its checksums).
  std::vector<std::string> skipped;
};

// The newest step directory under `root` whose every byte verifies (VerifyCheckpoint), or,
// when there is none, `root` itself if it is a complete checkpoint (a run that saved once,
// at its end, to the root). NotFound naming `root` (and what was skipped) when there is no
// complete checkpoint.
absl::StatusOr<LatestCheckpoint> FindLatestCheckpoint(const std::string& root);

// Deletes all but the `keep` newest step directories under `root` (keep >= 1), oldest
// first; returns how many it deleted. Call it once a newer checkpoint is committed: the
// ones it keeps are never touched. InvalidArgument for keep < 1; errors naming the
// directory it could not delete.
absl::StatusOr<int> PruneStepCheckpoints(const std::string& root, int keep);

}  // namespace checkpoint

#endif  // CHECKPOINT_SERIES_H_
