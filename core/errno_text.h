// The text of an errno value, for error messages: the one strerror wrapper of the
// library. Thread-safe (std::strerror is not: it may share one buffer between threads).
// Where an errno should also pick the status code, absl::ErrnoToStatus (absl/status/
// status.h) builds the whole status; ErrnoText serves callers that choose the code
// themselves (a socket error is Unavailable whatever the errno).
//
//   if (::bind(fd, addr, len) != 0) {
//     return absl::UnavailableError(absl::StrCat("cannot bind ", where, ": ",
//                                                core::ErrnoText(errno)));
//   }
#ifndef CORE_ERRNO_TEXT_H_
#define CORE_ERRNO_TEXT_H_

#include <string>

namespace core {

// strerror(err) ("No such file or directory" for ENOENT); "Unknown error <err>" for a
// value the C library does not know. Never empty.
std::string ErrnoText(int err);

}  // namespace core

#endif  // CORE_ERRNO_TEXT_H_
