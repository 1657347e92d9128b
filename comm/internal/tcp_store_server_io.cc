// Reading and buffering messages under the server's bounds, writing replies, refusing
// a connection (the TcpStoreServer::Loop parts that move bytes).
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/internal/store_protocol.h"
#include "comm/internal/tcp_store_server_loop.h"

namespace comm {
namespace internal {
namespace {

// Bytes read at most per connection per wakeup (so one busy client cannot starve the
// others).
constexpr size_t kReadBudgetPerEvent = 1 << 20;
// How long a refused connection is kept to deliver its error before it is closed.
constexpr absl::Duration kLingerLimit = absl::Seconds(2);
// Output buffers above this are freed once sent rather than kept for the next reply.
constexpr size_t kKeepOutputBytes = 64 * 1024;

}  // namespace

bool TcpStoreServer::Loop::OnEvent(Conn& c, uint32_t events) {
  if ((events & EPOLLOUT) != 0 && !Flush(c)) return false;
  if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) return OnReadable(c, events);
  return true;
}

bool TcpStoreServer::Loop::OnReadable(Conn& c, uint32_t events) {
  if (c.phase == Phase::kClosing) return Drain(c);
  if (Busy(c)) {
    // Not reading while a request is pending; a hang-up means the client has gone.
    if ((events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) {
      Close(c);
      return false;
    }
    return true;
  }
  size_t budget = kReadBudgetPerEvent;
  while (budget > 0 && c.phase != Phase::kClosing && !Busy(c)) {
    // Read no further than the current frame, so nothing of the next one is buffered.
    const size_t want = std::min(c.in.BytesWanted(), kChunkBytes);
    const bool body = c.in.InBody();
    const ssize_t n = ::recv(c.fd.get(), chunk_.get(), want, 0);
    if (n == 0) {
      Close(c);  // the client closed the connection
      return false;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      if (errno == EINTR) continue;
      Close(c);
      return false;
    }
    if (body && buffered_ + n > options_.max_buffered_bytes) {
      // Checked before the bytes are kept, so the bound holds exactly.
      return Refuse(c, absl::ResourceExhaustedError(absl::StrCat(
                           Where(c), ": partial messages of all clients hold ", buffered_,
                           " bytes; the rest of this message of ", c.in.AnnouncedBytes(),
                           " bytes does not fit under TcpStoreOptions.max_buffered_bytes (",
                           options_.max_buffered_bytes, ")")));
    }
    budget -= std::min(budget, static_cast<size_t>(n));
    absl::StatusOr<size_t> used = c.in.Consume(absl::string_view(chunk_.get(), n));
    if (!used.ok()) {
      if (c.phase == Phase::kHandshake) {
        return Refuse(
            c, absl::PermissionDeniedError(absl::StrCat(Where(c),
                                                        ": authentication failed: the job secret "
                                                        "(FSDP_JOB_SECRET) does not match")));
      }
      return Refuse(c, absl::InvalidArgumentError(absl::StrCat(
                           Where(c), ": ", used.status().message(),
                           " (TcpStoreOptions.max_value_bytes plus room for the key)")));
    }
    if (body) buffered_ += n;
    if (c.phase == Phase::kReady && c.in.InProgress() && c.in_deadline == absl::InfiniteFuture()) {
      c.in_deadline = absl::Now() + options_.partial_message_timeout;
    }
    if (c.in.HasFrame()) {
      buffered_ -= static_cast<int64_t>(c.in.BodyBytes());
      const std::string frame = c.in.TakeFrame();
      if (c.phase == Phase::kReady) c.in_deadline = absl::InfiniteFuture();
      if (!HandleFrame(c, frame)) return false;
    }
  }
  return true;
}

bool TcpStoreServer::Loop::Drain(Conn& c) {
  for (size_t budget = kReadBudgetPerEvent; budget > 0;) {
    const ssize_t n = ::recv(c.fd.get(), chunk_.get(), kChunkBytes, 0);
    if (n > 0) {
      budget -= std::min(budget, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n < 0 && errno == EINTR) continue;
    Close(c);  // the client has read our reply and hung up (or the socket failed)
    return false;
  }
  return true;
}

bool TcpStoreServer::Loop::Flush(Conn& c) {
  while (c.out_pos < c.out.size()) {
    const ssize_t n =
        ::send(c.fd.get(), c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_pos += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (c.out_deadline == absl::InfiniteFuture()) {
        c.out_deadline = absl::Now() + options_.partial_message_timeout;
      }
      return true;
    }
    Close(c);
    return false;
  }
  if (c.out.capacity() > kKeepOutputBytes) {
    std::string().swap(c.out);
  } else {
    c.out.clear();
  }
  c.out_pos = 0;
  c.out_deadline = absl::InfiniteFuture();
  // A refused connection has had its say: tell the client we are done (FIN), then wait
  // for it to hang up so that our reply is not lost to a reset.
  if (c.phase == Phase::kClosing) ::shutdown(c.fd.get(), SHUT_WR);
  return true;
}

bool TcpStoreServer::Loop::Reply(Conn& c, const absl::Status& status, absl::string_view body) {
  c.out.append(EncodeFrame(EncodeReply(status, body)));
  return Flush(c);
}

bool TcpStoreServer::Loop::Refuse(Conn& c, const absl::Status& status) {
  Unpark(c);
  buffered_ -= static_cast<int64_t>(c.in.BodyBytes());
  c.in = FrameAssembler(0);
  c.phase = Phase::kClosing;
  c.in_deadline = absl::InfiniteFuture();
  c.close_deadline = absl::Now() + std::min(kLingerLimit, options_.partial_message_timeout);
  return Reply(c, status);
}

}  // namespace internal
}  // namespace comm
