#include "checkpoint/internal/file_io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <random>
#include <system_error>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "core/text_file.h"

namespace checkpoint {
namespace internal {
namespace {

// The status of errno `err` for `what` failing on `path`: "<what> '<path>': <strerror>"
// with errno's canonical code (NotFound for ENOENT, AlreadyExists for EEXIST, ...).
absl::Status ErrnoError(int err, absl::string_view what, absl::string_view path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " '", path, "'"));
}

}  // namespace

absl::StatusOr<FileWriter> FileWriter::Create(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "cannot create", path);
  return FileWriter(fd, path);
}

FileWriter::FileWriter(FileWriter&& other) noexcept
    : fd_(other.fd_), path_(std::move(other.path_)), size_(other.size_) {
  other.fd_ = -1;
}

FileWriter& FileWriter::operator=(FileWriter&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    size_ = other.size_;
    other.fd_ = -1;
  }
  return *this;
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status FileWriter::Append(const void* data, size_t n) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("'", path_, "' is closed"));
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot write", path_);
    }
    p += w;
    n -= static_cast<size_t>(w);
    size_ += w;
  }
  return absl::OkStatus();
}

absl::Status FileWriter::SyncAndClose() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("'", path_, "' is closed"));
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(err, "cannot fsync", path_);
  }
  if (::close(fd) != 0) return ErrnoError(errno, "cannot close", path_);
  return absl::OkStatus();
}

absl::StatusOr<FileReader> FileReader::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open", path);
  return FileReader(fd, path);
}

FileReader::FileReader(FileReader&& other) noexcept
    : fd_(other.fd_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

FileReader& FileReader::operator=(FileReader&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

FileReader::~FileReader() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<size_t> FileReader::ReadAt(int64_t offset, size_t n, void* out) const {
  if (offset < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("negative offset ", offset, " in '", path_, "'"));
  }
  char* p = static_cast<char*>(out);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot read", path_);
    }
    if (r == 0) break;  // end of file
    done += static_cast<size_t>(r);
  }
  return done;
}

absl::StatusOr<int64_t> FileReader::Size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return ErrnoError(errno, "cannot stat", path_);
  return static_cast<int64_t>(st.st_size);
}

absl::StatusOr<FileLock> FileLock::Acquire(const std::string& path, absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  while (true) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoError(errno, "cannot open lock file", path);
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      // The previous holder removes the file before releasing it: make sure `path` still
      // names the file locked here, else try again with the current one.
      struct stat held, named;
      if (::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 &&
          held.st_dev == named.st_dev && held.st_ino == named.st_ino) {
        return FileLock(fd, path);
      }
      ::close(fd);
      continue;
    }
    const int err = errno;
    ::close(fd);
    if (err != EWOULDBLOCK && err != EINTR) return ErrnoError(err, "cannot lock", path);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "lock file '", path, "' is held by another process or thread (waited ",
          absl::FormatDuration(wait > absl::ZeroDuration() ? wait : absl::ZeroDuration()), ")"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

FileLock::FileLock(FileLock&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    Release();
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

FileLock::~FileLock() { Release(); }

void FileLock::Release() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still held: see Acquire
  ::close(fd_);
  fd_ = -1;
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  absl::StatusOr<FileReader> reader = FileReader::Open(path);
  if (!reader.ok()) return reader.status();
  absl::StatusOr<int64_t> size = reader->Size();
  if (!size.ok()) return size.status();
  std::string contents(static_cast<size_t>(*size), '\0');
  absl::StatusOr<size_t> got = reader->ReadAt(0, contents.size(), contents.data());
  if (!got.ok()) return got.status();
  contents.resize(*got);
  return contents;
}

absl::Status SyncDirectory(const std::string& path) { return core::SyncDirectory(path); }

std::string ParentDirectory(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

absl::Status MakeDirectories(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return ErrnoError(ec.value(), "cannot create directory", path);
  if (!std::filesystem::is_directory(path, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", path, "' exists and is not a directory"));
  }
  return absl::OkStatus();
}

absl::Status RemoveRecursively(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return ErrnoError(ec.value(), "cannot remove", path);
  return absl::OkStatus();
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return ErrnoError(errno, "cannot open directory", path);
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  return names;
}

absl::Status RenameAndSync(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return ErrnoError(errno, absl::StrCat("cannot rename '", from, "' to"), to);
  }
  return SyncDirectory(ParentDirectory(to));
}

std::string UniqueToken() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t process_seed = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  const uint64_t n = counter.fetch_add(1);
  const uint64_t t =
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  const uint64_t tid = std::hash<std::thread::id>()(std::this_thread::get_id());
  // splitmix64 finaliser over the mixed inputs: distinct counters give distinct
  // tokens within a process (the mix is a bijection of its input for fixed others).
  uint64_t x =
      process_seed ^ (static_cast<uint64_t>(::getpid()) << 40) ^ (t * 0x9E3779B97F4A7C15ull) ^ tid;
  x += n * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x = x ^ (x >> 31);
  return absl::StrFormat("%016x", x);
}

absl::StatusOr<std::string> MakeUniqueDirectory(const std::string& base) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string path = absl::StrCat(base, UniqueToken());
    if (::mkdir(path.c_str(), 0755) == 0) return path;
    if (errno != EEXIST) return ErrnoError(errno, "cannot create directory", path);
  }
  return absl::InternalError(absl::StrCat("cannot find a free name '", base, "<token>'"));
}

namespace {

absl::Status RenameAside(const std::string& staged, const std::string& target,
                         const std::function<absl::Status()>& after_swap) {
  const std::string parent = ParentDirectory(target);
  std::string aside;
  if (PathExists(target)) {
    aside = absl::StrCat(target, ".old-", UniqueToken());
    if (::rename(target.c_str(), aside.c_str()) != 0) {
      return ErrnoError(errno, absl::StrCat("cannot move '", target, "' aside to"), aside);
    }
  }
  if (::rename(staged.c_str(), target.c_str()) != 0) {
    const absl::Status error =
        ErrnoError(errno, absl::StrCat("cannot rename '", staged, "' to"), target);
    // Put the old directory back if nothing took its place.
    if (!aside.empty()) ::rename(aside.c_str(), target.c_str());
    return error;
  }
  RETURN_IF_ERROR(SyncDirectory(parent));
  if (after_swap) RETURN_IF_ERROR(after_swap());
  if (!aside.empty()) return RemoveRecursively(aside);
  return absl::OkStatus();
}

}  // namespace

absl::Status CommitDirectory(const std::string& staged, const std::string& target, CommitMode mode,
                             const std::function<absl::Status()>& after_swap) {
  if (mode == CommitMode::kRenameAside) return RenameAside(staged, target, after_swap);
  const std::string parent = ParentDirectory(target);
  for (int attempt = 0; attempt < 10; ++attempt) {
    // Swap with an existing target...
    if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
      RETURN_IF_ERROR(SyncDirectory(parent));
      if (after_swap) RETURN_IF_ERROR(after_swap());
      // `staged` now names the old directory.
      return RemoveRecursively(staged);
    }
    if (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) {
      return RenameAside(staged, target, after_swap);
    }
    if (errno != ENOENT) {
      return ErrnoError(errno, absl::StrCat("cannot exchange '", staged, "' with"), target);
    }
    // ...or, with none there, move into place without replacing one that appears
    // meanwhile (then try the exchange again).
    if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) == 0) {
      RETURN_IF_ERROR(SyncDirectory(parent));
      if (after_swap) return after_swap();
      return absl::OkStatus();
    }
    if (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) {
      return RenameAside(staged, target, after_swap);
    }
    if (errno != EEXIST) {
      return ErrnoError(errno, absl::StrCat("cannot rename '", staged, "' to"), target);
    }
  }
  return absl::AbortedError(absl::StrCat("'", target, "' kept changing while committing '", staged,
                                         "' (concurrent saves to one directory?)"));
}

}  // namespace internal
}  // namespace checkpoint
