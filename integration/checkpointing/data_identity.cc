#include "integration/checkpointing/data_identity.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace integration {
namespace {

constexpr size_t kShownChars = 96;

// `value` as a message shows it; a long one from a little before `at`.
std::string Shown(const std::optional<std::string>& value, size_t at) {
  if (!value.has_value()) return "(none)";
  const std::string& v = *value;
  if (v.empty()) return "''";
  if (v.size() <= kShownChars) return v;
  const size_t begin =
      std::min(at > kShownChars / 3 ? at - kShownChars / 3 : 0, v.size() - kShownChars);
  const size_t end = begin + kShownChars;
  return absl::StrCat(begin > 0 ? "..." : "", v.substr(begin, kShownChars),
                      end < v.size() ? "..." : "", " (", v.size(), " characters)");
}

}  // namespace

std::string DataIdentityChange::ToString() const {
  size_t at = 0;  // the first difference
  if (saved.has_value() && current.has_value()) {
    const size_t n = std::min(saved->size(), current->size());
    while (at < n && (*saved)[at] == (*current)[at]) ++at;
  }
  return absl::StrCat(key, ": the checkpoint's ", Shown(saved, at), " vs this module's ",
                      Shown(current, at));
}

namespace {

// Compares `saved` with `current` key by key; `what` ("data identity") and `source` (the
// TrainModule method) name them in the notes.
DataIdentityComparison Compare(const std::map<std::string, std::string>& saved,
                               const std::map<std::string, std::string>& current,
                               absl::string_view what, absl::string_view source) {
  DataIdentityComparison out;
  if (saved.empty() && current.empty()) return out;
  if (saved.empty()) {
    out.note = absl::StrCat("the checkpoint records no ", what,
                            " (it was saved before checkpoints kept one, or from a module that "
                            "gives none): the ",
                            what, " was not compared");
    return out;
  }
  if (current.empty()) {
    out.note = absl::StrCat("this module gives no ", what, " (TrainModule::", source,
                            "() is empty): the ", what, " was not compared with the checkpoint's");
    return out;
  }
  out.compared = true;
  auto s = saved.begin();
  auto c = current.begin();
  while (s != saved.end() || c != current.end()) {
    if (c == current.end() || (s != saved.end() && s->first < c->first)) {
      out.changes.push_back({s->first, s->second, std::nullopt});
      ++s;
    } else if (s == saved.end() || c->first < s->first) {
      out.changes.push_back({c->first, std::nullopt, c->second});
      ++c;
    } else {
      if (s->second != c->second) out.changes.push_back({s->first, s->second, c->second});
      ++s;
      ++c;
    }
  }
  return out;
}

}  // namespace

DataIdentityComparison CompareDataIdentity(const std::map<std::string, std::string>& saved,
                                           const std::map<std::string, std::string>& current) {
  return Compare(saved, current, "data identity", "DataIdentity");
}

DataIdentityComparison CompareDataPosition(const std::map<std::string, std::string>& saved,
                                           const std::map<std::string, std::string>& current) {
  return Compare(saved, current, "data position", "DataPosition");
}

}  // namespace integration
