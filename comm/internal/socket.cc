#include "comm/internal/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/errno_text.h"
#include "core/status_macros.h"

namespace comm {
namespace internal {
namespace {

// Milliseconds until `deadline` for poll(2), at least 0, at most ~24 days.
int PollMillis(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 0x7fffffff));
}

// Waits until `fd` has `events`; DeadlineExceeded at the deadline.
absl::Status PollFor(int fd, short events, absl::Time deadline, absl::string_view what) {
  while (true) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, PollMillis(deadline));
    if (r > 0) return absl::OkStatus();
    if (r == 0) {
      if (absl::Now() < deadline) continue;
      return absl::DeadlineExceededError(absl::StrCat(what, " timed out"));
    }
    if (errno != EINTR) {
      return absl::UnavailableError(absl::StrCat(what, ": poll failed: ", core::ErrnoText(errno)));
    }
  }
}

}  // namespace

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    Reset();
    fd_ = o.Release();
  }
  return *this;
}

void Fd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

absl::StatusOr<sockaddr_in> ResolveIPv4(absl::string_view host, int port) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port ", port, " is out of range [0, 65535]"));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const std::string h(host);
  if (::inet_pton(AF_INET, h.c_str(), &addr.sin_addr) == 1) return addr;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(h.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve host \"", host, "\": ", ::gai_strerror(rc)));
  }
  addr.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return addr;
}

std::string IPv4ToString(const sockaddr_in& addr) {
  char buf[INET_ADDRSTRLEN] = {0};
  ::inet_ntop(AF_INET, &addr.sin_addr, buf, sizeof(buf));
  return buf;
}

bool IsLoopback(absl::string_view host) {
  absl::StatusOr<sockaddr_in> a = ResolveIPv4(host, 0);
  return a.ok() && (ntohl(a->sin_addr.s_addr) >> 24) == 127;
}

absl::StatusOr<Fd> Listen(absl::string_view host, int port, int backlog) {
  absl::StatusOr<sockaddr_in> addr = ResolveIPv4(host, port);
  if (!addr.ok()) return addr.status();
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::InternalError(absl::StrCat("socket: ", core::ErrnoText(errno)));
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot bind ", host, ":", port, ": ", core::ErrnoText(errno)));
  }
  if (::listen(fd.get(), backlog) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", host, ":", port, ": ", core::ErrnoText(errno)));
  }
  return fd;
}

absl::StatusOr<int> BoundPort(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return absl::InternalError(absl::StrCat("getsockname: ", core::ErrnoText(errno)));
  }
  return static_cast<int>(ntohs(addr.sin_port));
}

absl::StatusOr<Fd> ConnectOnce(absl::string_view host, int port, absl::Time deadline) {
  absl::StatusOr<sockaddr_in> addr = ResolveIPv4(host, port);
  if (!addr.ok()) return addr.status();
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return absl::InternalError(absl::StrCat("socket: ", core::ErrnoText(errno)));
  const std::string where = absl::StrCat(host, ":", port);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    if (errno != EINPROGRESS) {
      return absl::UnavailableError(
          absl::StrCat("connect to ", where, ": ", core::ErrnoText(errno)));
    }
    RETURN_IF_ERROR(PollFor(fd.get(), POLLOUT, deadline, absl::StrCat("connect to ", where)));
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      return absl::UnavailableError(absl::StrCat("connect to ", where, ": ", core::ErrnoText(err)));
    }
  }
  const int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

absl::Status SendAll(int fd, const void* data, size_t n, absl::Time deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      RETURN_IF_ERROR(PollFor(fd, POLLOUT, deadline, "send"));
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    return absl::UnavailableError(absl::StrCat("send failed: ", core::ErrnoText(errno)));
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int fd, void* data, size_t n, absl::Time deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return absl::UnavailableError("connection closed by peer");
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      RETURN_IF_ERROR(PollFor(fd, POLLIN, deadline, "recv"));
      continue;
    }
    if (errno == EINTR) continue;
    return absl::UnavailableError(absl::StrCat("recv failed: ", core::ErrnoText(errno)));
  }
  return absl::OkStatus();
}

absl::Status SendFrame(int fd, absl::string_view payload, absl::Time deadline) {
  if (payload.size() > 0xffffffffu) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame of ", payload.size(), " bytes exceeds 4 GiB"));
  }
  const uint32_t len = static_cast<uint32_t>(payload.size());
  const unsigned char header[4] = {
      static_cast<unsigned char>(len), static_cast<unsigned char>(len >> 8),
      static_cast<unsigned char>(len >> 16), static_cast<unsigned char>(len >> 24)};
  RETURN_IF_ERROR(SendAll(fd, header, 4, deadline));
  return SendAll(fd, payload.data(), payload.size(), deadline);
}

absl::StatusOr<std::string> RecvFrame(int fd, size_t max_bytes, absl::Time deadline) {
  unsigned char header[4];
  RETURN_IF_ERROR(RecvAll(fd, header, 4, deadline));
  const size_t len = static_cast<size_t>(header[0]) | (static_cast<size_t>(header[1]) << 8) |
                     (static_cast<size_t>(header[2]) << 16) |
                     (static_cast<size_t>(header[3]) << 24);
  if (len > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("message of ", len, " bytes exceeds the limit of ", max_bytes, " bytes"));
  }
  // Grow with what arrives (at most doubling), so a header alone costs no memory.
  std::string out;
  while (out.size() < len) {
    const size_t chunk = std::min(len - out.size(), std::max<size_t>(out.size(), 64 * 1024));
    const size_t old = out.size();
    out.resize(old + chunk);
    RETURN_IF_ERROR(RecvAll(fd, out.data() + old, chunk, deadline));
  }
  return out;
}

absl::StatusOr<std::string> LocalAddressFor(absl::string_view peer_host) {
  absl::StatusOr<sockaddr_in> peer = ResolveIPv4(peer_host, 9);
  if (!peer.ok()) return peer.status();
  if ((ntohl(peer->sin_addr.s_addr) >> 24) == 127) return std::string("127.0.0.1");
  Fd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::InternalError(absl::StrCat("socket: ", core::ErrnoText(errno)));
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&*peer), sizeof(*peer)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("no route to ", peer_host, ": ", core::ErrnoText(errno)));
  }
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0) {
    return absl::InternalError(absl::StrCat("getsockname: ", core::ErrnoText(errno)));
  }
  return IPv4ToString(local);
}

absl::StatusOr<int> PickFreePort(absl::string_view host) {
  absl::StatusOr<Fd> fd = Listen(host, 0, 1);
  if (!fd.ok()) return fd.status();
  return BoundPort(fd->get());
}

}  // namespace internal
}  // namespace comm
