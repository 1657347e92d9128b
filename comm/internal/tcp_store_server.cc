#include "comm/internal/tcp_store_server.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/internal/sha256.h"
#include "comm/internal/store_protocol.h"
#include "comm/internal/store_util.h"
#include "comm/internal/tcp_store_server_loop.h"
#include "core/errno_text.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace comm {
namespace internal {
namespace {

// How long accepting pauses when the process is out of descriptors.
constexpr absl::Duration kAcceptPause = absl::Milliseconds(100);
std::string PeerName(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "unknown peer";
  return absl::StrCat(IPv4ToString(addr), ":", ntohs(addr.sin_port));
}

}  // namespace

void TcpStoreServer::Loop::Run() {
  std::vector<epoll_event> events(256);
  while (!stop_.load()) {
    const int n =
        ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), TimeoutMillis());
    if (n < 0) {
      if (errno == EINTR) continue;
      LOG(ERROR) << where_ << ": epoll_wait failed (" << core::ErrnoText(errno)
                 << "); closing every connection";
      break;
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kWakeTag) {
        uint64_t count = 0;
        (void)!::read(wake_.get(), &count, sizeof(count));
      } else if (tag == kListenTag) {
        AcceptAll();
      } else {
        auto it = conns_.find(tag);
        if (it == conns_.end()) continue;  // closed earlier in this batch
        Conn& c = *it->second;
        if (OnEvent(c, events[i].events)) Refresh(c);
      }
    }
    const absl::Time now = absl::Now();
    if (accept_paused_ && now >= accept_resume_) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = kListenTag;
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listen_.get(), &ev);
      accept_paused_ = false;
      accept_resume_ = absl::InfiniteFuture();
    }
    while (!timers_.empty() && timers_.begin()->first <= now) {
      const uint64_t id = timers_.begin()->second;
      timers_.erase(timers_.begin());
      auto it = conns_.find(id);
      if (it == conns_.end()) continue;
      Conn& c = *it->second;
      c.timer_at = absl::InfiniteFuture();
      if (OnTimer(c, now)) Refresh(c);
    }
  }
  conns_.clear();
  connections_.store(0);
  listen_.Reset();
}

int TcpStoreServer::Loop::TimeoutMillis() const {
  absl::Time next = accept_resume_;
  if (!timers_.empty()) next = std::min(next, timers_.begin()->first);
  if (next == absl::InfiniteFuture()) return -1;
  const absl::Duration left = next - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  // Rounded up, so the loop does not spin in the last fraction of a millisecond.
  return static_cast<int>(std::min<int64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), int64_t{1} << 30));
}

void TcpStoreServer::Loop::PauseAccepting(absl::Time now) {
  epoll_event ev{};
  ev.events = 0;
  ev.data.u64 = kListenTag;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listen_.get(), &ev);
  accept_paused_ = true;
  accept_resume_ = now + kAcceptPause;
}

void TcpStoreServer::Loop::AcceptAll() {
  for (int i = 0; i < 256; ++i) {
    const int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      // Out of descriptors or memory: the pending connection stays in the backlog, and
      // level-triggered epoll would report it again at once, so pause instead of spinning.
      LOG_EVERY_N(WARNING, 100) << where_ << ": accept failed (" << core::ErrnoText(errno)
                                << "); pausing new connections for "
                                << absl::FormatDuration(kAcceptPause);
      PauseAccepting(absl::Now());
      return;
    }
    if (static_cast<int64_t>(conns_.size()) >= options_.max_connections) {
      ::close(fd);
      LOG_EVERY_N(WARNING, 1000) << where_ << ": " << conns_.size()
                                 << " connections are open, the limit "
                                    "(TcpStoreOptions.max_connections); closed a new one";
      continue;
    }
    AddConn(fd);
  }
}

void TcpStoreServer::Loop::AddConn(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const bool auth = !options_.secret.empty();
  const uint64_t id = next_id_++;
  auto owned =
      std::make_unique<Conn>(id, fd, auth ? kStoreMaxHandshakeBytes : options_.max_frame_bytes);
  Conn& c = *owned;
  c.peer = PeerName(fd);
  c.events = EPOLLIN | EPOLLRDHUP;
  epoll_event ev{};
  ev.events = c.events;
  ev.data.u64 = id;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
    LOG(WARNING) << Where(c) << ": epoll_ctl failed (" << core::ErrnoText(errno)
                 << "); closing the connection";
    return;  // `owned` closes it
  }
  conns_.emplace(id, std::move(owned));
  connections_.fetch_add(1);
  Hello hello;
  hello.auth_required = auth;
  if (auth) {
    // Unpredictable without nonce_key_ (random per server) and never repeated.
    c.server_nonce = HmacSha256(nonce_key_, absl::StrCat(nonce_counter_++));
    hello.nonce = c.server_nonce;
    c.phase = Phase::kHandshake;
    c.in_deadline = absl::Now() + options_.partial_message_timeout;
  }
  c.out = EncodeFrame(EncodeHello(hello));
  if (Flush(c)) Refresh(c);
}

bool TcpStoreServer::Loop::OnTimer(Conn& c, absl::Time now) {
  if (c.close_deadline <= now) {
    Close(c);
    return false;
  }
  if (c.in_deadline <= now) {
    if (c.phase == Phase::kHandshake) {
      LOG_EVERY_N(WARNING, 100) << Where(c) << ": no authentication within "
                                << absl::FormatDuration(options_.partial_message_timeout)
                                << " (TcpStoreOptions.partial_message_timeout); closed it";
    } else {
      LOG_EVERY_N(WARNING, 100) << Where(c) << ": a message of " << c.in.AnnouncedBytes()
                                << " bytes had " << c.in.BodyBytes() << " bytes after "
                                << absl::FormatDuration(options_.partial_message_timeout)
                                << " (TcpStoreOptions.partial_message_timeout); closed it";
    }
    Close(c);
    return false;
  }
  if (c.out_deadline <= now) {
    LOG_EVERY_N(WARNING, 100) << Where(c) << ": did not read its reply within "
                              << absl::FormatDuration(options_.partial_message_timeout)
                              << " (TcpStoreOptions.partial_message_timeout); closed it";
    Close(c);
    return false;
  }
  if (c.wait.has_value() && c.wait->deadline <= now) {
    const absl::Status timed_out =
        WaitTimedOut("TcpStore", MissingKeys(c.wait->keys), c.wait->timeout);
    Unpark(c);
    return Reply(c, timed_out);
  }
  return true;
}

void TcpStoreServer::Loop::Refresh(Conn& c) {
  uint32_t events = EPOLLRDHUP;
  if (c.phase == Phase::kClosing || !Busy(c)) events |= EPOLLIN;
  if (c.out_pos < c.out.size()) events |= EPOLLOUT;
  if (events != c.events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = c.id;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
    c.events = events;
  }
  absl::Time at = std::min({c.in_deadline, c.out_deadline, c.close_deadline});
  if (c.wait.has_value()) at = std::min(at, c.wait->deadline);
  if (at != c.timer_at) {
    if (c.timer_at != absl::InfiniteFuture()) timers_.erase({c.timer_at, c.id});
    if (at != absl::InfiniteFuture()) timers_.insert({at, c.id});
    c.timer_at = at;
  }
}

void TcpStoreServer::Loop::Close(Conn& c) {
  Unpark(c);
  if (c.timer_at != absl::InfiniteFuture()) timers_.erase({c.timer_at, c.id});
  buffered_ -= static_cast<int64_t>(c.in.BodyBytes());
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
  conns_.erase(c.id);  // closes the descriptor; `c` is gone
  connections_.fetch_sub(1);
}

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(
    const TcpStoreServerOptions& options) {
  const std::string where = absl::StrCat("TcpStore server ", options.host, ":", options.port);
  absl::StatusOr<Fd> listen = Listen(options.host, options.port);
  if (!listen.ok()) return core::Annotate(listen.status(), "TcpStore server");
  absl::StatusOr<int> port = BoundPort(listen->get());
  if (!port.ok()) return port.status();
  // Non-blocking, so that accepting until EAGAIN never stalls the loop.
  const int fl = ::fcntl(listen->get(), F_GETFL, 0);
  if (fl < 0 || ::fcntl(listen->get(), F_SETFL, fl | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat(where, ": fcntl: ", core::ErrnoText(errno)));
  }
  Fd epoll(::epoll_create1(EPOLL_CLOEXEC));
  Fd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!epoll.valid() || !wake.valid()) {
    return absl::InternalError(
        absl::StrCat(where, ": cannot create epoll/eventfd: ", core::ErrnoText(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = Loop::kListenTag;
  if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, listen->get(), &ev) != 0) {
    return absl::InternalError(absl::StrCat(where, ": epoll_ctl: ", core::ErrnoText(errno)));
  }
  ev.data.u64 = Loop::kWakeTag;
  if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, wake.get(), &ev) != 0) {
    return absl::InternalError(absl::StrCat(where, ": epoll_ctl: ", core::ErrnoText(errno)));
  }
  std::string nonce_key;
  if (!options.secret.empty()) {
    nonce_key.resize(kSha256Bytes);
    if (::getrandom(nonce_key.data(), nonce_key.size(), 0) !=
        static_cast<ssize_t>(nonce_key.size())) {
      return absl::InternalError(
          absl::StrCat(where, ": getrandom failed: ", core::ErrnoText(errno)));
    }
  } else {
    LOG_FIRST_N(WARNING, 1)
        << "TcpStore server " << options.host << ":" << *port
        << " runs without a job secret: any process that can reach this port can read and "
           "change the store. Set FSDP_JOB_SECRET (TcpStoreOptions.secret) on every rank to "
           "require one.";
  }
  auto loop = std::make_unique<Loop>(options, *port, *std::move(listen), std::move(epoll),
                                     std::move(wake), std::move(nonce_key));
  return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(*port, std::move(loop)));
}

TcpStoreServer::TcpStoreServer(int port, std::unique_ptr<Loop> loop)
    : port_(port), loop_(std::move(loop)) {
  thread_ = std::thread([l = loop_.get()] { l->Run(); });
}

TcpStoreServer::~TcpStoreServer() {
  loop_->Stop();
  if (thread_.joinable()) thread_.join();
}

int TcpStoreServer::connection_count() const { return loop_->connection_count(); }

}  // namespace internal
}  // namespace comm
