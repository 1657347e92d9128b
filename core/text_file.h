// Reading a small text file that a user named (a config file given by a flag), with
// the mistakes that would otherwise pass silently turned into errors: a directory, an
// unreadable file, a binary file or a huge file is an error naming the path, never an
// empty or garbled text. And the one atomic file write of the library: readers see the
// old file or the complete new one, never a half-written one, and it is on disk (file and
// directory fsync'ed) when the call returns.
//
//   ASSIGN_OR_RETURN(std::string text,
//                    core::ReadTextFile(path, "stage config"));   // "stage config file '...'"
//   RETURN_IF_ERROR(core::WriteFileAtomically("/out/summary.json", text));
#ifndef CORE_TEXT_FILE_H_
#define CORE_TEXT_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace core {

// Largest file ReadTextFile accepts by default.
inline constexpr int64_t kMaxTextFileBytes = int64_t{16} << 20;

// The whole contents of `path`. Errors name the file as "<what> file '<path>'":
// NotFound when it does not exist; InvalidArgument when it is a directory or not a
// regular file, cannot be opened or read (permissions, I/O error), is longer than
// `max_bytes`, or is not text (it holds a NUL byte or is not valid UTF-8; the message
// gives the offset of the first bad byte).
absl::StatusOr<std::string> ReadTextFile(const std::string& path, absl::string_view what,
                                         int64_t max_bytes = kMaxTextFileBytes);

// The offset of the first byte that makes `text` not text (a NUL, or a byte that is not
// part of a well-formed UTF-8 sequence), or -1 when it is all text.
int64_t FirstNonTextByte(absl::string_view text);

// Writes `contents` (any bytes) to `path` through a temporary file in the same directory
// (hidden: ".<name>.tmp.<unique>", so it never takes a name the caller's files have;
// created exclusively, written, fsync'ed, closed), a rename onto `path` and an fsync of
// the directory, so readers see either the old file or the complete new one, never part
// of it, and the new one survives a crash once this returns OK. On a failure before the
// rename the temporary file is removed and `path` is untouched; a failing directory
// fsync (after the rename) is reported with the new file in place. InvalidArgument for
// an empty path; otherwise the errno's canonical code (NotFound for a missing
// directory, ...) with a message "WriteFileAtomically(<path>): <what failed> <file>:
// <strerror>" naming the path and, where that is the one that failed, the temporary
// file or the directory.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// The same for contents held in several buffers (a header and tensor bytes, say): the
// file holds the concatenation of `pieces`, written without copying them into one.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::Span<const absl::string_view> pieces);

// fsyncs directory `path`, so entries created or renamed in it are durable. OK where the
// filesystem refuses fsync on directories (EINVAL, EROFS): durability is then its to
// give. Errors by errno's canonical code, "cannot open directory '<path>': <strerror>"
// or "cannot fsync directory '<path>': <strerror>".
absl::Status SyncDirectory(const std::string& path);

}  // namespace core

#endif  // CORE_TEXT_FILE_H_
