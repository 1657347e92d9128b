#include "core/host_memory.h"

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/format_bytes.h"
#include "core/text_file.h"

namespace core {
namespace {

// Limits at or above this are "unlimited" (v1 writes 2^63 rounded down to a page).
constexpr int64_t kNoLimit = int64_t{1} << 62;

// The integer in a cgroup file ("max" and absurd values give nullopt).
std::optional<int64_t> ReadCgroupNumber(const std::string& path) {
  absl::StatusOr<std::string> text = ReadTextFile(path, "cgroup", /*max_bytes=*/4096);
  if (!text.ok()) return std::nullopt;
  int64_t value = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &value) || value < 0) {
    return std::nullopt;
  }
  return value;
}

// "/a/b/c" -> {"/a/b/c", "/a/b", "/a", ""}: a cgroup and its ancestors, as suffixes of
// the mount point ("" is the mount point itself).
std::vector<std::string> SelfAndAncestors(std::string path) {
  std::vector<std::string> out;
  while (!path.empty() && path.back() == '/') path.pop_back();
  while (!path.empty()) {
    out.push_back(path);
    const size_t slash = path.rfind('/');
    path = slash == std::string::npos ? "" : path.substr(0, slash);
  }
  out.push_back("");
  return out;
}

// Tightens info->cgroup_limit with the limits of `dir` + each of `cgroups`' ancestors.
void ApplyCgroupLimits(const std::string& dir, const std::string& cgroup, const char* limit_name,
                       const char* usage_name, HostMemoryInfo* info) {
  for (const std::string& suffix : SelfAndAncestors(cgroup)) {
    const std::string base = dir + suffix;
    const std::optional<int64_t> limit = ReadCgroupNumber(base + "/" + limit_name);
    if (!limit.has_value() || *limit >= kNoLimit) continue;
    const int64_t usage = ReadCgroupNumber(base + "/" + usage_name).value_or(0);
    const int64_t headroom = std::max<int64_t>(0, *limit - usage);
    const bool tighter = !info->cgroup_limit.has_value() ||
                         headroom < std::max<int64_t>(0, *info->cgroup_limit - info->cgroup_usage);
    if (tighter) {
      info->cgroup_limit = *limit;
      info->cgroup_usage = usage;
      info->cgroup_limit_file = base + "/" + limit_name;
    }
  }
}

}  // namespace

int64_t HostMemoryInfo::Available() const {
  int64_t available = mem_available;
  if (cgroup_limit.has_value()) {
    available = std::min(available, std::max<int64_t>(0, *cgroup_limit - cgroup_usage));
  }
  return available;
}

int64_t HostMemoryInfo::Capacity() const {
  int64_t capacity = mem_total + swap_total;
  if (cgroup_limit.has_value()) capacity = std::min(capacity, *cgroup_limit);
  return capacity;
}

std::string HostMemoryInfo::Describe() const {
  std::string out = absl::StrCat("MemAvailable ", FormatBytes(mem_available), " of MemTotal ",
                                 FormatBytes(mem_total));
  if (swap_total > 0) absl::StrAppend(&out, " (+ swap ", FormatBytes(swap_total), ")");
  if (cgroup_limit.has_value()) {
    absl::StrAppend(&out, "; cgroup limit ", FormatBytes(*cgroup_limit), " (usage ",
                    FormatBytes(cgroup_usage), ", ", cgroup_limit_file, ")");
  }
  return out;
}

absl::StatusOr<HostMemoryInfo> ParseMeminfo(absl::string_view meminfo, absl::string_view source) {
  HostMemoryInfo info;
  struct Field {
    const char* name;
    int64_t* value;
    bool found;
  };
  Field fields[] = {{"MemTotal", &info.mem_total, false},
                    {"MemAvailable", &info.mem_available, false},
                    {"SwapTotal", &info.swap_total, false}};
  for (absl::string_view line : absl::StrSplit(meminfo, '\n')) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    const absl::string_view key = line.substr(0, colon);
    for (Field& field : fields) {
      if (key != field.name) continue;
      absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
      int64_t multiplier = 1;
      if (absl::ConsumeSuffix(&value, "kB")) multiplier = 1024;
      int64_t number = 0;
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(value), &number) || number < 0 ||
          number > (kNoLimit / multiplier)) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": field ", field.name,
                                                       " has a malformed value '",
                                                       line.substr(colon + 1), "'"));
      }
      *field.value = number * multiplier;
      field.found = true;
    }
  }
  for (const Field& field : fields) {
    if (!field.found && std::string(field.name) != "SwapTotal") {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": no ", field.name, " line (is this /proc/meminfo?)"));
    }
  }
  return info;
}

absl::StatusOr<HostMemoryInfo> ReadHostMemoryInfo(const HostMemoryPaths& paths) {
  absl::StatusOr<std::string> meminfo = ReadTextFile(paths.meminfo, "meminfo");
  if (!meminfo.ok()) return meminfo.status();
  absl::StatusOr<HostMemoryInfo> info = ParseMeminfo(*meminfo, paths.meminfo);
  if (!info.ok()) return info.status();
  absl::StatusOr<std::string> membership = ReadTextFile(paths.self_cgroup, "cgroup membership");
  if (!membership.ok()) return info;  // no cgroups: no limit beyond the host's
  for (absl::string_view line : absl::StrSplit(*membership, '\n', absl::SkipEmpty())) {
    // "hierarchy-id:controllers:path"; the path may itself hold ':'.
    std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    const std::string cgroup(parts[2]);
    if (parts[0] == "0" && parts[1].empty()) {
      ApplyCgroupLimits(paths.cgroup_root, cgroup, "memory.max", "memory.current", &*info);
    } else {
      for (absl::string_view controller : absl::StrSplit(parts[1], ',')) {
        if (controller == "memory") {
          ApplyCgroupLimits(paths.cgroup_root + "/memory", cgroup, "memory.limit_in_bytes",
                            "memory.usage_in_bytes", &*info);
        }
      }
    }
  }
  // Inside a cgroup namespace the process's own path may not exist under the mount; the
  // mount point's files (tried above as the last ancestor) then describe its limit.
  return info;
}

int64_t HostMemoryCapacityBytes() {
  static const int64_t capacity = [] {
    absl::StatusOr<HostMemoryInfo> info = ReadHostMemoryInfo();
    return info.ok() ? info->Capacity() : int64_t{0};
  }();
  return capacity;
}

}  // namespace core
