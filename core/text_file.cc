#include "core/text_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/errno_text.h"
#include "core/status_macros.h"

namespace core {
namespace {

// Length of the UTF-8 sequence `lead` starts (0 for a byte that cannot start one) and
// the smallest code point it may encode (to reject overlong forms).
int SequenceLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xc2 && lead <= 0xdf) return 2;
  if (lead >= 0xe0 && lead <= 0xef) return 3;
  if (lead >= 0xf0 && lead <= 0xf4) return 4;
  return 0;
}

}  // namespace

int64_t FirstNonTextByte(absl::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const int64_t n = static_cast<int64_t>(text.size());
  int64_t i = 0;
  while (i < n) {
    const unsigned char lead = bytes[i];
    if (lead == 0) return i;
    const int len = SequenceLength(lead);
    if (len == 0 || i + len > n) return i;
    uint32_t cp = len == 1 ? lead : (lead & (0xff >> (len + 1)));
    for (int k = 1; k < len; ++k) {
      if ((bytes[i + k] & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (bytes[i + k] & 0x3f);
    }
    const bool overlong = (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
    const bool surrogate = cp >= 0xd800 && cp <= 0xdfff;
    if (overlong || surrogate || cp > 0x10ffff) return i;
    i += len;
  }
  return -1;
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path, absl::string_view what,
                                         int64_t max_bytes) {
  const std::string name = absl::StrCat(what, " file '", path, "'");
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " file: empty path"));
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    const std::string reason = ErrnoText(err);
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat("cannot read ", name, ": ", reason));
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", name, ": ", reason));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " is a directory; give the path of a text file"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " is not a regular file; give the path of a text file"));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", name, ": ", ErrnoText(errno)));
  }
  std::string contents;
  char buffer[1 << 16];
  while (true) {
    const ssize_t got = ::read(fd, buffer, sizeof(buffer));
    if (got < 0) {
      if (errno == EINTR) continue;
      const std::string reason = ErrnoText(errno);
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat("cannot read ", name, ": ", reason));
    }
    if (got == 0) break;
    if (static_cast<int64_t>(contents.size()) + got > max_bytes) {
      ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat(name, " is larger than ", max_bytes, " bytes; is it the right file?"));
    }
    contents.append(buffer, static_cast<size_t>(got));
  }
  ::close(fd);
  const int64_t bad = FirstNonTextByte(contents);
  if (bad >= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s is not a text file (byte 0x%02x at offset %d is %s)", name,
                        static_cast<unsigned char>(contents[bad]), bad,
                        contents[bad] == '\0' ? "a NUL" : "not valid UTF-8"));
  }
  return contents;
}

absl::Status SyncDirectory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open directory '", path, "'"));
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EINVAL || err == EROFS) return absl::OkStatus();
    return absl::ErrnoToStatus(err, absl::StrCat("cannot fsync directory '", path, "'"));
  }
  ::close(fd);
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  return WriteFileAtomically(path, absl::MakeConstSpan(&contents, 1));
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::Span<const absl::string_view> pieces) {
  if (path.empty()) return absl::InvalidArgumentError("WriteFileAtomically: the path is empty");
  auto error = [&](int err, absl::string_view what, const std::string& file) {
    return absl::ErrnoToStatus(err,
                               absl::StrCat("WriteFileAtomically(", path, "): ", what, " ", file));
  };
  // The temporary file is hidden (".<name>.tmp.<pid>.<salt>.<n>" beside `path`), so it
  // never takes a name a caller gives its files. Names differ between calls (counter),
  // processes (pid) and hosts sharing a filesystem (a per-process random value); O_EXCL
  // never reuses a file still there.
  static std::atomic<int64_t> counter{0};
  static const uint32_t process_salt = std::random_device()();
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  const std::string hidden = slash == std::string::npos ? absl::StrCat(".", path)
                                                        : absl::StrCat(path.substr(0, slash + 1),
                                                                       ".", path.substr(slash + 1));
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    tmp = absl::StrCat(hidden, ".tmp.", ::getpid(), ".", absl::Hex(process_salt), ".", counter++);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && (errno != EEXIST || attempt == 99)) {
      return error(errno, "cannot create temporary file", tmp);
    }
  }
  auto discard = [&](int err, absl::string_view what) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    return error(err, what, tmp);
  };
  for (absl::string_view piece : pieces) {
    size_t written = 0;
    while (written < piece.size()) {
      const ssize_t n = ::write(fd, piece.data() + written, piece.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return discard(errno, "cannot write temporary file");
      written += static_cast<size_t>(n);
    }
  }
  if (::fsync(fd) != 0) return discard(errno, "cannot flush temporary file");
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) return discard(errno, "cannot close temporary file");
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return error(err, "cannot rename temporary file onto", path);
  }
  absl::Status synced = SyncDirectory(dir);
  if (!synced.ok()) {
    return Annotate(synced, absl::StrCat("WriteFileAtomically(", path, ")"));
  }
  return absl::OkStatus();
}

}  // namespace core
