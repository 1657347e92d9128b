#include "comm/internal/slurm.h"

#include <cstdint>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace comm {
namespace internal {
namespace {

constexpr size_t kMaxNames = 1000000;

absl::Status BadList(absl::string_view list, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("SLURM_JOB_NODELIST=\"", list, "\" is not a Slurm host list: ", why));
}

// Splits at the commas outside brackets.
std::vector<std::string> TopLevelItems(absl::string_view list) {
  std::vector<std::string> items(1);
  int depth = 0;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      items.emplace_back();
    } else {
      items.back().push_back(c);
    }
  }
  return items;
}

// The numbers of one bracket group ("01-03,7"), as strings with lo's zero padding.
absl::StatusOr<std::vector<std::string>> ExpandGroup(absl::string_view list,
                                                     absl::string_view group) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(group, ',')) {
    const size_t dash = part.find('-');
    const absl::string_view lo_text = part.substr(0, dash);
    const absl::string_view hi_text =
        dash == absl::string_view::npos ? lo_text : part.substr(dash + 1);
    int64_t lo = 0, hi = 0;
    if (lo_text.empty() || !absl::SimpleAtoi(lo_text, &lo) || !absl::SimpleAtoi(hi_text, &hi) ||
        lo < 0) {
      return BadList(list, absl::StrCat("\"", part, "\" is not a number or a range lo-hi"));
    }
    if (hi < lo) return BadList(list, absl::StrCat("the range ", part, " ends below its start"));
    if (static_cast<size_t>(hi - lo) >= kMaxNames) return BadList(list, "too many names");
    for (int64_t v = lo; v <= hi; ++v) {
      std::string digits = absl::StrCat(v);
      if (digits.size() < lo_text.size()) {
        digits.insert(0, lo_text.size() - digits.size(), '0');
      }
      out.push_back(std::move(digits));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandSlurmHostList(absl::string_view list) {
  if (list.empty()) return BadList(list, "it is empty");
  std::vector<std::string> names;
  for (const std::string& item : TopLevelItems(list)) {
    if (item.empty()) return BadList(list, "it has an empty name");
    // Expand bracket groups left to right: every prefix so far times the group's numbers.
    std::vector<std::string> partial = {""};
    size_t i = 0;
    while (i < item.size()) {
      const size_t open = item.find('[', i);
      const std::string literal = item.substr(i, open == std::string::npos ? open : open - i);
      for (std::string& p : partial) p += literal;
      if (open == std::string::npos) break;
      const size_t close = item.find(']', open);
      if (close == std::string::npos) return BadList(list, "a bracket is not closed");
      if (close == open + 1) return BadList(list, "a bracket is empty");
      absl::StatusOr<std::vector<std::string>> numbers =
          ExpandGroup(list, absl::string_view(item).substr(open + 1, close - open - 1));
      if (!numbers.ok()) return numbers.status();
      std::vector<std::string> next;
      for (const std::string& p : partial) {
        for (const std::string& n : *numbers) next.push_back(p + n);
      }
      if (next.size() > kMaxNames) return BadList(list, "too many names");
      partial = std::move(next);
      i = close + 1;
    }
    names.insert(names.end(), partial.begin(), partial.end());
    if (names.size() > kMaxNames) return BadList(list, "too many names");
  }
  return names;
}

absl::StatusOr<std::vector<int>> ExpandSlurmTasksPerNode(absl::string_view spec) {
  const auto bad = [&]() {
    return absl::InvalidArgumentError(absl::StrCat(
        "SLURM_TASKS_PER_NODE=\"", spec, "\" is not a Slurm task count list (like \"4(x2),2\")"));
  };
  if (spec.empty()) return bad();
  std::vector<int> counts;
  for (absl::string_view part : absl::StrSplit(spec, ',')) {
    int n = 0, repeat = 1;
    const size_t paren = part.find('(');
    if (paren != absl::string_view::npos) {
      const absl::string_view rest = part.substr(paren);  // "(xk)"
      if (rest.size() < 4 || rest.substr(0, 2) != "(x" || rest.back() != ')' ||
          !absl::SimpleAtoi(rest.substr(2, rest.size() - 3), &repeat)) {
        return bad();
      }
    }
    if (!absl::SimpleAtoi(part.substr(0, paren), &n) || n < 1 || repeat < 1 ||
        counts.size() + static_cast<size_t>(repeat) > kMaxNames) {
      return bad();
    }
    counts.insert(counts.end(), static_cast<size_t>(repeat), n);
  }
  return counts;
}

}  // namespace internal
}  // namespace comm
