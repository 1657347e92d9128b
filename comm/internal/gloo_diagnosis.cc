#include "comm/internal/gloo_diagnosis.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "comm/failure.h"

namespace comm {
namespace internal {
namespace {

// Record layout: "v1\n<code>\n<root|destroyed|secondary:<r,r,...>>\n<message>".
constexpr char kRecordVersion[] = "v1";

std::string LastPhrase(const std::optional<int64_t>& last) {
  return last.has_value() ? absl::StrCat("last at collective #", *last) : "no collective yet";
}

// The status message without the "secondary (caused by ...): " prefix MarkSecondary adds.
absl::string_view WithoutSecondaryPrefix(absl::string_view message) {
  constexpr absl::string_view kPrefix = "secondary (caused by ";
  if (!absl::StartsWith(message, kPrefix)) return message;
  const size_t end = message.find("): ");
  return end == absl::string_view::npos ? message : message.substr(end + 3);
}

}  // namespace

std::string ProgressKey(int rank) { return absl::StrCat("progress/", rank); }
std::string BrokenKey(int rank) { return absl::StrCat("broken/", rank); }
std::string ConnKey(int rank) { return absl::StrCat("conn/", rank); }

std::string RanksPhrase(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "));
}

ArrivalReport DescribeArrival(uint64_t seq,
                              const std::vector<std::optional<int64_t>>& last_started) {
  ArrivalReport report;
  for (int r = 0; r < static_cast<int>(last_started.size()); ++r) {
    const bool arrived =
        last_started[r].has_value() && *last_started[r] >= static_cast<int64_t>(seq);
    (arrived ? report.arrived : report.missing).push_back(r);
  }
  if (report.missing.empty()) {
    report.text = absl::StrCat("every rank arrived (", RanksPhrase(report.arrived), ")");
    return report;
  }
  if (report.missing.size() == 1) {
    const int r = report.missing[0];
    report.text = absl::StrCat("rank ", r, " did not arrive (", LastPhrase(last_started[r]), ")");
  } else {
    std::vector<std::string> parts;
    for (int r : report.missing) {
      parts.push_back(absl::StrCat(r, " (", LastPhrase(last_started[r]), ")"));
    }
    report.text = absl::StrCat("ranks ", absl::StrJoin(parts, ", "), " did not arrive");
  }
  if (!report.arrived.empty()) {
    absl::StrAppend(&report.text, "; ", RanksPhrase(report.arrived), " did");
  }
  return report;
}

std::optional<int64_t> ParseProgress(absl::string_view value) {
  int64_t n = 0;
  if (value.empty() || value.size() > 20 || !absl::SimpleAtoi(value, &n) || n < 0) {
    return std::nullopt;
  }
  return n;
}

std::string EncodeBrokenRecord(const absl::Status& status) {
  std::string kind = "root";
  if (IsSecondary(status))
    kind = absl::StrCat("secondary:", absl::StrJoin(CulpritRanks(status), ","));
  return absl::StrCat(kRecordVersion, "\n", static_cast<int>(status.code()), "\n", kind, "\n",
                      WithoutSecondaryPrefix(status.message()));
}

std::string EncodeDestroyedRecord() {
  return absl::StrCat(kRecordVersion, "\n", static_cast<int>(absl::StatusCode::kUnavailable),
                      "\ndestroyed\nits group was destroyed");
}

absl::StatusOr<BrokenRecord> DecodeBrokenRecord(absl::string_view value) {
  std::vector<absl::string_view> parts = absl::StrSplit(value, absl::MaxSplits('\n', 3));
  int code = 0;
  if (parts.size() != 4 || parts[0] != kRecordVersion || !absl::SimpleAtoi(parts[1], &code) ||
      code <= 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::DataLossError("not a gloo group failure record");
  }
  BrokenRecord record;
  record.code = static_cast<absl::StatusCode>(code);
  record.message = std::string(parts[3]);
  if (parts[2] == "destroyed") {
    record.destroyed = true;
  } else if (absl::StartsWith(parts[2], "secondary:")) {
    record.secondary = true;
    for (absl::string_view r : absl::StrSplit(parts[2].substr(10), ',', absl::SkipEmpty())) {
      int rank = 0;
      if (!absl::SimpleAtoi(r, &rank) || rank < 0) {
        return absl::DataLossError("gloo group failure record: bad culprit rank");
      }
      record.culprits.push_back(rank);
    }
  } else if (parts[2] != "root") {
    return absl::DataLossError("gloo group failure record: unknown kind");
  }
  return record;
}

}  // namespace internal
}  // namespace comm
