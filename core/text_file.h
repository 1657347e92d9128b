// Reading a small text file that a user named (a config file given by a flag), with
// the mistakes that would otherwise pass silently turned into errors: a directory, an
// unreadable file, a binary file or a huge file is an error naming the path, never an
// empty or garbled text.
//
//   ASSIGN_OR_RETURN(std::string text,
//                    core::ReadTextFile(path, "stage config"));   // "stage config file '...'"
#ifndef CORE_TEXT_FILE_H_
#define CORE_TEXT_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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

}  // namespace core

#endif  // CORE_TEXT_FILE_H_
