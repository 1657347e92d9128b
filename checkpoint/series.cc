#include "checkpoint/series.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/internal/file_io.h"
#include "checkpoint/internal/metadata.h"
#include "checkpoint/sharded.h"
#include "core/status_macros.h"

namespace checkpoint {

namespace {
constexpr char kPrefix[] = "step-";
}  // namespace

std::string StepDirectory(const std::string& root, int64_t step) {
  return internal::JoinPath(root, absl::StrFormat("%s%09d", kPrefix, step));
}

absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> ListStepCheckpoints(
    const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> steps;
  if (!internal::PathExists(root)) return steps;
  ASSIGN_OR_RETURN(std::vector<std::string> names, internal::ListDirectory(root));
  for (const std::string& name : names) {
    if (!absl::StartsWith(name, kPrefix)) continue;
    const std::string digits = name.substr(sizeof(kPrefix) - 1);
    int64_t step = 0;
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit) ||
        !absl::SimpleAtoi(digits, &step)) {
      continue;
    }
    steps.emplace_back(step, internal::JoinPath(root, name));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::StatusOr<LatestCheckpoint> FindLatestCheckpoint(const std::string& root) {
  ASSIGN_OR_RETURN(auto steps, ListStepCheckpoints(root));
  LatestCheckpoint latest;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    absl::Status verified = VerifyCheckpoint(it->second).status();
    absl::StatusOr<CheckpointInfo> info =
        verified.ok() ? ReadMetadata(it->second) : absl::StatusOr<CheckpointInfo>(verified);
    if (info.ok()) {
      latest.dir = it->second;
      latest.step = info->step;
      return latest;
    }
    latest.skipped.push_back(absl::StrCat(it->second, ": ", info.status().message()));
  }
  if (steps.empty()) {
    if (absl::StatusOr<CheckpointInfo> info = ReadMetadata(root); info.ok()) {
      latest.dir = root;
      latest.step = info->step;
      return latest;
    }
  }
  return absl::NotFoundError(
      absl::StrCat("no complete checkpoint under '", root, "'",
                   latest.skipped.empty()
                       ? ""
                       : absl::StrCat(" (skipped ", absl::StrJoin(latest.skipped, "; "), ")")));
}

absl::StatusOr<int> PruneStepCheckpoints(const std::string& root, int keep) {
  if (keep < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PruneStepCheckpoints: keep = ", keep, " under '", root, "'; need >= 1"));
  }
  ASSIGN_OR_RETURN(auto steps, ListStepCheckpoints(root));
  int deleted = 0;
  for (size_t i = 0; i + keep < steps.size(); ++i) {
    RETURN_IF_ERROR(internal::RemoveRecursively(steps[i].second));
    ++deleted;
  }
  return deleted;
}

}  // namespace checkpoint
