// Small POSIX socket helpers for TcpStore and the launcher: IPv4 resolution, listen,
// connect with a deadline, length-prefixed frames, and picking a local address.
// Every call that can block takes a deadline and returns DeadlineExceeded after it.
#ifndef COMM_INTERNAL_SOCKET_H_
#define COMM_INTERNAL_SOCKET_H_

#include <netinet/in.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace comm {
namespace internal {

// Closes the descriptor it owns when destroyed. Movable.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.Release()) {}
  Fd& operator=(Fd&& o) noexcept;
  ~Fd() { Reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset();

 private:
  int fd_ = -1;
};

// The IPv4 address of `host` (a dotted quad or a name), port set to `port`.
absl::StatusOr<sockaddr_in> ResolveIPv4(absl::string_view host, int port);

// "a.b.c.d".
std::string IPv4ToString(const sockaddr_in& addr);

// True if `host` resolves to 127.0.0.0/8.
bool IsLoopback(absl::string_view host);

// A listening TCP socket bound to host:port (port 0: the kernel picks one).
absl::StatusOr<Fd> Listen(absl::string_view host, int port, int backlog = 128);

// The port a bound socket got.
absl::StatusOr<int> BoundPort(int fd);

// One connection attempt to host:port that gives up at `deadline`.
absl::StatusOr<Fd> ConnectOnce(absl::string_view host, int port, absl::Time deadline);

// Writes all of `data`, or fails at `deadline` or on a socket error.
absl::Status SendAll(int fd, const void* data, size_t n, absl::Time deadline);

// Reads exactly `n` bytes. Unavailable when the peer closes the connection first.
absl::Status RecvAll(int fd, void* data, size_t n, absl::Time deadline);

// A frame: a 4-byte little-endian length, then that many bytes.
absl::Status SendFrame(int fd, absl::string_view payload, absl::Time deadline);

// Reads one frame; InvalidArgument (without reading the body) when its length is over
// `max_bytes`. Memory grows with the bytes that arrive, not with the announced length.
absl::StatusOr<std::string> RecvFrame(int fd, size_t max_bytes, absl::Time deadline);

// The local IPv4 address the kernel would use to reach `peer_host` (found with a UDP
// socket that is connected, which sends nothing). 127.0.0.1 for a loopback peer.
absl::StatusOr<std::string> LocalAddressFor(absl::string_view peer_host);

// A TCP port on `host` that was free a moment ago (bind to port 0, read it, close).
absl::StatusOr<int> PickFreePort(absl::string_view host = "127.0.0.1");

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_SOCKET_H_
