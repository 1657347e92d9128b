// POSIX file helpers for checkpoint/: writing with fsync, positioned reads that report
// short reads, directory fsync and removal, unique temporary names, the atomic
// directory swap Save commits with, and the lock file Save holds. Every error names the
// path and carries errno's canonical code (absl::ErrnoToStatus). A single file replaced
// atomically goes through core::WriteFileAtomically (core/text_file.h) instead.
//
//   ASSIGN_OR_RETURN(auto w, checkpoint::internal::FileWriter::Create(dir + "/data_0"));
//   RETURN_IF_ERROR(w.Append(bytes.data(), bytes.size()));
//   RETURN_IF_ERROR(w.SyncAndClose());
//   RETURN_IF_ERROR(checkpoint::internal::SyncDirectory(dir));
#ifndef CHECKPOINT_INTERNAL_FILE_IO_H_
#define CHECKPOINT_INTERNAL_FILE_IO_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace checkpoint {
namespace internal {

// A file opened for writing (created or truncated). Closes (without fsync) on
// destruction if SyncAndClose was not called. Movable.
class FileWriter {
 public:
  static absl::StatusOr<FileWriter> Create(const std::string& path);
  FileWriter(FileWriter&& other) noexcept;
  FileWriter& operator=(FileWriter&& other) noexcept;
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;
  ~FileWriter();

  // Writes all `n` bytes at the end of what was written so far.
  absl::Status Append(const void* data, size_t n);
  // fsync, then close. The writer is unusable afterwards.
  absl::Status SyncAndClose();
  // Bytes appended so far.
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  FileWriter(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
  int64_t size_ = 0;
};

// A file opened read-only. Movable; closes on destruction.
class FileReader {
 public:
  // NotFound when the file does not exist; other errors by errno.
  static absl::StatusOr<FileReader> Open(const std::string& path);
  FileReader(FileReader&& other) noexcept;
  FileReader& operator=(FileReader&& other) noexcept;
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;
  ~FileReader();

  // Reads up to `n` bytes at `offset` into `out`; returns how many were read, fewer
  // than `n` only at the end of the file.
  absl::StatusOr<size_t> ReadAt(int64_t offset, size_t n, void* out) const;
  // Current size of the file in bytes.
  absl::StatusOr<int64_t> Size() const;
  const std::string& path() const { return path_; }

 private:
  FileReader(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

// An exclusive advisory lock (flock) on a lock file, held from Acquire until
// destruction, which removes the file and then releases the lock. Excludes other
// holders in this and other processes on the same host, and across hosts where the
// filesystem implements flock; a holder that dies releases it with its process.
// Movable.
class FileLock {
 public:
  // Creates `path` if needed and locks it, retrying every few milliseconds until `wait`
  // has passed (wait <= 0: a single try). DeadlineExceeded naming the path when another
  // holder keeps it; other errors by errno. Never returns a lock on a file that another
  // holder has already removed (it checks the path still names the locked file).
  static absl::StatusOr<FileLock> Acquire(const std::string& path, absl::Duration wait);
  FileLock(FileLock&& other) noexcept;
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();

  const std::string& path() const { return path_; }

 private:
  FileLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  void Release();
  int fd_ = -1;
  std::string path_;
};

// The whole file's contents; NotFound when it does not exist.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// fsyncs a directory, so entries created or renamed in it are durable
// (core::SyncDirectory, core/text_file.h).
absl::Status SyncDirectory(const std::string& path);

// "a/b" for "a/b/c"; "." for "c".
std::string ParentDirectory(const std::string& path);

// Creates `path` and missing parents (like mkdir -p); OK if it exists as a directory.
absl::Status MakeDirectories(const std::string& path);

// Removes `path` and everything below it; OK if it does not exist.
absl::Status RemoveRecursively(const std::string& path);

// True if `path` exists (file or directory).
bool PathExists(const std::string& path);

// The names of `path`'s entries (not "." or ".."), in no particular order; errno's status
// naming the directory (NotFound when it does not exist) when it cannot be opened.
absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& path);

// rename(from, to), then fsync of the target's parent directory.
absl::Status RenameAndSync(const std::string& from, const std::string& to);

// 16 lowercase hex digits that differ between calls in one process (a counter) and
// between processes and threads (pid, thread, clock, random device).
std::string UniqueToken();

// Creates a fresh directory "<base><UniqueToken()>" with mkdir (which fails rather
// than reuse an existing name; it retries with a new token) and returns its path.
absl::StatusOr<std::string> MakeUniqueDirectory(const std::string& base);

// How CommitDirectory puts a complete new directory in place.
enum class CommitMode {
  // Linux renameat2(RENAME_EXCHANGE): `target` switches from the old directory to the
  // new one in one step; falls back to kRenameAside where the filesystem lacks it.
  kAtomicExchange,
  // Portable: rename `target` aside to "<target>.old-<token>", rename the new one into
  // place, delete the old. A crash between the two renames leaves no `target`, but
  // the old checkpoint complete under its aside name.
  kRenameAside,
};

// Moves directory `staged` to `target`, replacing (and then deleting) any directory
// already there, and fsyncs the parent. On error `target` holds the old directory or
// nothing changed. When `after_swap` is non-null it is called after the new
// directory is in place and before the old one is deleted; if it fails, CommitDirectory
// returns its error and leaves the old directory where it is (a test hook for crashes).
absl::Status CommitDirectory(const std::string& staged, const std::string& target,
                             CommitMode mode = CommitMode::kAtomicExchange,
                             const std::function<absl::Status()>& after_swap = nullptr);

}  // namespace internal
}  // namespace checkpoint

#endif  // CHECKPOINT_INTERNAL_FILE_IO_H_
