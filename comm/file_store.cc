#include "comm/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/internal/store_util.h"
#include "core/errno_text.h"
#include "core/status_macros.h"
#include "core/text_file.h"

namespace comm {
namespace {

absl::Status MakeDirs(const std::string& path) {
  std::string partial;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || (path[i] == '/' && i > 0)) {
      partial = path.substr(0, i);
      if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
        return absl::InternalError(absl::StrCat("FileStore: cannot create directory ", partial,
                                                ": ", core::ErrnoText(errno)));
      }
    }
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InternalError(absl::StrCat("FileStore: ", path, " is not a directory"));
  }
  return absl::OkStatus();
}

// Polls `ready` with backoff from 1 ms up to 50 ms until it is true or `timeout` passes.
template <typename Fn>
bool PollUntil(Fn ready, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration sleep = absl::Milliseconds(1);
  while (true) {
    if (ready()) return true;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    absl::SleepFor(std::min(sleep, left));
    sleep = std::min(sleep * 2, absl::Milliseconds(50));
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<FileStore>> FileStore::Open(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("FileStore: empty directory path");
  RETURN_IF_ERROR(MakeDirs(path));
  return std::shared_ptr<FileStore>(new FileStore(path));
}

std::string FileStore::KeyPath(absl::string_view key) const {
  static constexpr char kHex[] = "0123456789abcdef";
  // File names are limited to 255 bytes: a long key keeps a readable head and gets a
  // 64-bit FNV-1a hash of the whole key (stable across processes and builds).
  if (key.size() > 80) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
    std::string head;
    for (unsigned char c : key.substr(0, 60)) head.push_back(std::isalnum(c) ? c : '_');
    return absl::StrCat(path_, "/h_", head, "_", absl::Hex(h, absl::kZeroPad16));
  }
  std::string name = "k_";
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.') {
      name.push_back(static_cast<char>(c));
    } else {
      name.push_back('%');
      name.push_back(kHex[c >> 4]);
      name.push_back(kHex[c & 15]);
    }
  }
  return absl::StrCat(path_, "/", name);
}

absl::Status FileStore::WriteAtomically(const std::string& file, absl::string_view value) {
  // The temporary file is hidden (".k_..."), a name no key maps to (KeyPath's start
  // with "k_" or "h_"), so a reader never sees a half-written value.
  absl::Status written = core::WriteFileAtomically(file, value);
  if (!written.ok()) {
    return absl::InternalError(absl::StrCat("FileStore ", path_, ": ", written.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileStore::ReadKey(absl::string_view key) const {
  std::ifstream in(KeyPath(key), std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("FileStore: no key \"", key, "\""));
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

absl::Status FileStore::Set(absl::string_view key, absl::string_view value) {
  return WriteAtomically(KeyPath(key), value);
}

absl::StatusOr<std::string> FileStore::Get(absl::string_view key, absl::Duration timeout) {
  absl::StatusOr<std::string> value;
  const bool found = PollUntil(
      [&] {
        value = ReadKey(key);
        return value.ok();
      },
      timeout);
  if (!found) {
    return internal::WaitTimedOut(absl::StrCat("FileStore ", path_), {std::string(key)}, timeout);
  }
  return value;
}

absl::StatusOr<int64_t> FileStore::Add(absl::string_view key, int64_t delta) {
  const std::string lock_path = absl::StrCat(path_, "/.lock");
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("FileStore: cannot open ", lock_path, ": ", core::ErrnoText(errno)));
  }
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  while (::flock(fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      return absl::InternalError(
          absl::StrCat("FileStore: cannot lock ", lock_path, ": ", core::ErrnoText(errno)));
    }
  }
  absl::Cleanup unlock = [fd] { ::flock(fd, LOCK_UN); };
  absl::StatusOr<std::string> current = ReadKey(key);
  absl::StatusOr<int64_t> value = internal::AddToCounter(absl::StrCat("FileStore ", path_), key,
                                                         current.ok() ? &*current : nullptr, delta);
  if (!value.ok()) return value.status();
  RETURN_IF_ERROR(WriteAtomically(KeyPath(key), absl::StrCat(*value)));
  return value;
}

absl::Status FileStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  auto all_present = [&] {
    for (const std::string& k : keys) {
      if (::access(KeyPath(k).c_str(), F_OK) != 0) return false;
    }
    return true;
  };
  if (PollUntil(all_present, timeout)) return absl::OkStatus();
  std::vector<std::string> missing;
  for (const std::string& k : keys) {
    if (::access(KeyPath(k).c_str(), F_OK) != 0) missing.push_back(k);
  }
  return internal::WaitTimedOut(absl::StrCat("FileStore ", path_), missing, timeout);
}

absl::StatusOr<bool> FileStore::Check(const std::vector<std::string>& keys) {
  for (const std::string& k : keys) {
    if (::access(KeyPath(k).c_str(), F_OK) != 0) return false;
  }
  return true;
}

absl::StatusOr<bool> FileStore::DeleteKey(absl::string_view key) {
  if (::unlink(KeyPath(key).c_str()) == 0) return true;
  if (errno == ENOENT) return false;
  return absl::InternalError(
      absl::StrCat("FileStore: cannot delete key \"", key, "\": ", core::ErrnoText(errno)));
}

}  // namespace comm
