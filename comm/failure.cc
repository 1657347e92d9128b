#include "comm/failure.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "core/text_file.h"
#include "nlohmann/json.hpp"

namespace comm {
namespace {

constexpr char kSecondaryPrefix[] = "secondary (caused by ";

absl::Mutex g_record_mutex;
bool g_root_recorded ABSL_GUARDED_BY(g_record_mutex) = false;
bool g_any_recorded ABSL_GUARDED_BY(g_record_mutex) = false;

}  // namespace

absl::Status MarkSecondary(absl::Status status, const std::vector<int>& culprit_ranks) {
  if (status.ok() || IsSecondary(status)) return status;
  std::string who = culprit_ranks.empty()
                        ? "another rank"
                        : absl::StrCat(culprit_ranks.size() == 1 ? "rank " : "ranks ",
                                       absl::StrJoin(culprit_ranks, ", "));
  absl::Status out(status.code(), absl::StrCat(kSecondaryPrefix, who, "): ", status.message()));
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  out.SetPayload(kSecondaryPayload, absl::Cord(absl::StrJoin(culprit_ranks, ",")));
  return out;
}

namespace {

// The culprit list of a secondary error: from its payload, or else from the message
// marker, which survives callers that annotate an error into a new status (keeping the
// message but not the payloads). nullopt when the error is not secondary.
absl::optional<std::vector<int>> Culprits(const absl::Status& status) {
  std::string list;
  if (absl::optional<absl::Cord> payload = status.GetPayload(kSecondaryPayload)) {
    list = std::string(*payload);
  } else {
    absl::string_view m = status.message();
    const size_t at = m.find(kSecondaryPrefix);
    if (at == absl::string_view::npos) return absl::nullopt;
    m.remove_prefix(at + sizeof(kSecondaryPrefix) - 1);
    const size_t end = m.find("): ");
    if (end == absl::string_view::npos) return absl::nullopt;
    m = m.substr(0, end);
    if (!absl::ConsumePrefix(&m, "ranks ") && !absl::ConsumePrefix(&m, "rank ")) {
      return std::vector<int>();  // "another rank"
    }
    list = absl::StrReplaceAll(m, {{" ", ""}});
  }
  std::vector<int> ranks;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    int r = 0;
    if (absl::SimpleAtoi(part, &r)) ranks.push_back(r);
  }
  return ranks;
}

}  // namespace

bool IsSecondary(const absl::Status& status) {
  return !status.ok() && Culprits(status).has_value();
}

std::vector<int> CulpritRanks(const absl::Status& status) {
  return Culprits(status).value_or(std::vector<int>());
}

std::string FailureRecord::ToJson() const {
  nlohmann::json j;
  j["rank"] = rank;
  j["time_unix_ns"] = time_unix_ns;
  j["code"] = code;
  j["code_name"] = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  j["message"] = message;
  j["secondary"] = secondary;
  j["culprit_ranks"] = culprit_ranks;
  return j.dump();
}

absl::StatusOr<FailureRecord> ParseFailureRecord(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::DataLossError("failure record: not a JSON object");
  }
  FailureRecord r;
  try {
    r.rank = j.at("rank").get<int>();
    r.time_unix_ns = j.at("time_unix_ns").get<int64_t>();
    r.code = j.at("code").get<int>();
    r.message = j.at("message").get<std::string>();
    r.secondary = j.at("secondary").get<bool>();
    r.culprit_ranks = j.at("culprit_ranks").get<std::vector<int>>();
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat("failure record: ", e.what()));
  }
  return r;
}

absl::Status RecordFailure(const absl::Status& status, int rank) {
  if (status.ok()) return absl::OkStatus();
  const char* path = std::getenv(kErrorFileEnv);
  if (path == nullptr || *path == '\0') return absl::OkStatus();
  const bool secondary = IsSecondary(status);
  absl::MutexLock lock(&g_record_mutex);
  // A root cause is never replaced; a secondary error replaces nothing.
  if (g_root_recorded || (secondary && g_any_recorded)) return absl::OkStatus();
  FailureRecord record;
  record.rank = rank;
  record.time_unix_ns = absl::ToUnixNanos(absl::Now());
  record.code = static_cast<int>(status.code());
  record.message = std::string(status.message());
  record.secondary = secondary;
  record.culprit_ranks = CulpritRanks(status);
  const std::string text = record.ToJson() + "\n";
  if (absl::Status written = core::WriteFileAtomically(path, text); !written.ok()) {
    return core::Annotate(written, absl::StrCat(kErrorFileEnv, "=", path));
  }
  g_any_recorded = true;
  if (!secondary) g_root_recorded = true;
  return absl::OkStatus();
}

absl::StatusOr<FailureRecord> ReadFailureRecord(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("no failure record at ", path));
  std::stringstream s;
  s << in.rdbuf();
  return ParseFailureRecord(s.str());
}

}  // namespace comm
