#include "comm/internal/lost_ranks.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/errno_text.h"

namespace comm {
namespace internal {
namespace {

constexpr char kFileName[] = "lost-ranks";

// Creates `path` empty, or truncates it; an error naming the path if it cannot.
absl::Status CreateEmpty(const std::string& path, absl::string_view what) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot ", what, " the lost-ranks file ", path, ": ", core::ErrnoText(errno)));
  }
  ::close(fd);
  return absl::OkStatus();
}

}  // namespace

LostRanks ParseLostRanks(absl::string_view text, int nproc) {
  LostRanks lost;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    int rank = -1;
    if (absl::SimpleAtoi(line, &rank) && rank >= 0 && rank < nproc &&
        std::all_of(line.begin(), line.end(), [](char c) { return absl::ascii_isdigit(c); })) {
      lost.ranks.push_back(rank);
    } else {
      lost.ignored.emplace_back(line);
    }
  }
  std::sort(lost.ranks.begin(), lost.ranks.end());
  lost.ranks.erase(std::unique(lost.ranks.begin(), lost.ranks.end()), lost.ranks.end());
  return lost;
}

LostRanksFile::~LostRanksFile() {
  if (temporary_dir_.empty()) return;
  ::unlink(path_.c_str());
  ::rmdir(temporary_dir_.c_str());
}

absl::Status LostRanksFile::Open(const std::string& path) {
  if (!path.empty()) {
    path_ = path;
    return CreateEmpty(path_, "create");
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/fsdp-lost-ranks-XXXXXX");
  if (::mkdtemp(pattern.data()) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create a directory for the lost-ranks file (", pattern,
                     "): ", core::ErrnoText(errno)));
  }
  temporary_dir_ = pattern;
  path_ = absl::StrCat(temporary_dir_, "/", kFileName);
  return CreateEmpty(path_, "create");
}

absl::StatusOr<LostRanks> LostRanksFile::Read(int nproc) const {
  std::ifstream in(path_);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read the lost-ranks file ", path_));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseLostRanks(text.str(), nproc);
}

absl::Status LostRanksFile::Truncate() const { return CreateEmpty(path_, "empty"); }

}  // namespace internal
}  // namespace comm
