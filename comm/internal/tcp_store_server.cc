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
#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/internal/sha256.h"
#include "comm/internal/store_protocol.h"
#include "comm/internal/store_util.h"
#include "core/errno_text.h"
#include "glog/logging.h"

namespace comm {
namespace internal {
namespace {

// epoll tags of the two descriptors that are not connections; connection ids start above.
constexpr uint64_t kListenTag = 0;
constexpr uint64_t kWakeTag = 1;
// Bytes read per recv, and at most per connection per wakeup (so one busy client cannot
// starve the others).
constexpr size_t kChunkBytes = 64 * 1024;
constexpr size_t kReadBudgetPerEvent = 1 << 20;
// How long a refused connection is kept to deliver its error before it is closed.
constexpr absl::Duration kLingerLimit = absl::Seconds(2);
// How long accepting pauses when the process is out of descriptors.
constexpr absl::Duration kAcceptPause = absl::Milliseconds(100);
// Output buffers above this are freed once sent rather than kept for the next reply.
constexpr size_t kKeepOutputBytes = 64 * 1024;

std::string PeerName(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "unknown peer";
  return absl::StrCat(IPv4ToString(addr), ":", ntohs(addr.sin_port));
}

}  // namespace

// The event loop and everything it owns. All members but `stop_` and `connections_` are
// touched only by the loop's thread.
class TcpStoreServer::Loop {
 public:
  Loop(const TcpStoreServerOptions& options, int port, Fd listen, Fd epoll, Fd wake,
       std::string nonce_key)
      : options_(options),
        where_(absl::StrCat("TcpStore server ", options.host, ":", port)),
        listen_(std::move(listen)),
        epoll_(std::move(epoll)),
        wake_(std::move(wake)),
        nonce_key_(std::move(nonce_key)),
        chunk_(new char[kChunkBytes]) {}

  void Run();

  // Thread-safe: makes Run return soon.
  void Stop() {
    stop_.store(true);
    const uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof(one));
  }

  int connection_count() const { return connections_.load(); }

 private:
  enum class Phase {
    kHandshake,  // waiting for the client's proof of the secret
    kReady,      // serving requests
    kClosing,    // refused: delivering the error, discarding input, then closing
  };

  // A Get or Wait whose keys are not all set yet.
  struct PendingWait {
    StoreOp op;
    std::vector<std::string> keys;
    absl::Duration timeout;
    absl::Time deadline;
  };

  struct Conn {
    Conn(uint64_t id, int fd, size_t max_frame) : id(id), fd(fd), in(max_frame) {}
    const uint64_t id;
    Fd fd;
    std::string peer;
    Phase phase = Phase::kReady;
    FrameAssembler in;
    std::string out;
    size_t out_pos = 0;
    std::string server_nonce;
    std::optional<PendingWait> wait;
    std::set<std::string> missing;                       // keys of `wait` not seen set yet
    absl::Time in_deadline = absl::InfiniteFuture();     // partial message / handshake
    absl::Time out_deadline = absl::InfiniteFuture();    // reply the client does not read
    absl::Time close_deadline = absl::InfiniteFuture();  // end of kClosing
    absl::Time timer_at = absl::InfiniteFuture();        // its entry in timers_
    uint32_t events = 0;                                 // its epoll interest
  };

  std::string Where(const Conn& c) const { return absl::StrCat(where_, " (client ", c.peer, ")"); }
  bool Busy(const Conn& c) const { return c.wait.has_value() || c.out_pos < c.out.size(); }

  int TimeoutMillis() const;
  void AcceptAll();
  void AddConn(int fd);
  void PauseAccepting(absl::Time now);

  // Each of these returns false when it closed the connection (`c` is gone then).
  bool OnEvent(Conn& c, uint32_t events);
  bool OnReadable(Conn& c, uint32_t events);
  bool Drain(Conn& c);
  bool Flush(Conn& c);
  bool Reply(Conn& c, const absl::Status& status, absl::string_view body = "");
  bool Refuse(Conn& c, const absl::Status& status);
  bool HandleFrame(Conn& c, const std::string& frame);
  bool HandleAuth(Conn& c, const std::string& frame);
  bool Execute(Conn& c, Request& req);
  bool OnTimer(Conn& c, absl::Time now);

  void Park(Conn& c, Request& req);
  void Unpark(Conn& c);
  void KeySet(const std::string& key);
  void Refresh(Conn& c);
  void Close(Conn& c);
  std::vector<std::string> MissingKeys(const std::vector<std::string>& keys) const;

  const TcpStoreServerOptions options_;
  const std::string where_;
  Fd listen_;
  Fd epoll_;
  Fd wake_;
  const std::string nonce_key_;
  uint64_t nonce_counter_ = 0;
  std::unique_ptr<char[]> chunk_;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};

  uint64_t next_id_ = kWakeTag + 1;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
  std::set<std::pair<absl::Time, uint64_t>> timers_;
  bool accept_paused_ = false;
  absl::Time accept_resume_ = absl::InfiniteFuture();
  int64_t buffered_ = 0;  // body bytes of partial messages, all connections

  std::unordered_map<std::string, std::string> map_;
  // Connections waiting on each key.
  std::unordered_map<std::string, std::set<uint64_t>> waiters_;
};

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

bool TcpStoreServer::Loop::HandleFrame(Conn& c, const std::string& frame) {
  if (c.phase == Phase::kHandshake) return HandleAuth(c, frame);
  absl::StatusOr<Request> req = ParseRequest(frame);
  if (!req.ok()) {
    return Reply(c,
                 absl::InvalidArgumentError(absl::StrCat(Where(c), ": ", req.status().message())));
  }
  return Execute(c, *req);
}

bool TcpStoreServer::Loop::HandleAuth(Conn& c, const std::string& frame) {
  absl::StatusOr<AuthProof> proof = ParseAuthProof(frame);
  if (!proof.ok() || !ConstantTimeEquals(proof->mac, ClientProof(options_.secret, c.server_nonce,
                                                                 proof->client_nonce))) {
    LOG_EVERY_N(WARNING, 100) << Where(c)
                              << ": a client failed to prove it knows the job secret "
                                 "(FSDP_JOB_SECRET); closed its connection";
    return Refuse(c, absl::PermissionDeniedError(
                         absl::StrCat(Where(c),
                                      ": authentication failed: the job secret (FSDP_JOB_SECRET) "
                                      "does not match")));
  }
  c.phase = Phase::kReady;
  c.in_deadline = absl::InfiniteFuture();
  c.in.set_max_frame_bytes(options_.max_frame_bytes);
  return Reply(c, absl::OkStatus(),
               ServerProof(options_.secret, c.server_nonce, proof->client_nonce));
}

bool TcpStoreServer::Loop::Execute(Conn& c, Request& req) {
  switch (req.op) {
    case StoreOp::kSet:
      map_[req.key] = std::move(req.value);
      KeySet(req.key);
      return Reply(c, absl::OkStatus());
    case StoreOp::kGet: {
      auto it = map_.find(req.key);
      if (it != map_.end()) return Reply(c, absl::OkStatus(), it->second);
      Park(c, req);
      return true;
    }
    case StoreOp::kAdd: {
      auto it = map_.find(req.key);
      absl::StatusOr<int64_t> sum =
          AddToCounter("TcpStore", req.key, it == map_.end() ? nullptr : &it->second, req.delta);
      if (!sum.ok()) return Reply(c, sum.status());
      map_[req.key] = absl::StrCat(*sum);
      KeySet(req.key);
      return Reply(c, absl::OkStatus(), EncodeI64(*sum));
    }
    case StoreOp::kWait:
      if (MissingKeys(req.keys).empty()) return Reply(c, absl::OkStatus());
      Park(c, req);
      return true;
    case StoreOp::kCheck:
      return Reply(c, absl::OkStatus(), EncodeBool(MissingKeys(req.keys).empty()));
    case StoreOp::kDelete:
      return Reply(c, absl::OkStatus(), EncodeBool(map_.erase(req.key) > 0));
  }
  return Reply(c, absl::InvalidArgumentError(absl::StrCat(Where(c), ": unknown request")));
}

std::vector<std::string> TcpStoreServer::Loop::MissingKeys(
    const std::vector<std::string>& keys) const {
  std::vector<std::string> missing;
  for (const std::string& k : keys) {
    if (map_.find(k) == map_.end()) missing.push_back(k);
  }
  return missing;
}

void TcpStoreServer::Loop::Park(Conn& c, Request& req) {
  PendingWait w;
  w.op = req.op;
  w.keys = req.op == StoreOp::kGet ? std::vector<std::string>{req.key} : std::move(req.keys);
  w.timeout = absl::Milliseconds(req.timeout_ms);
  w.deadline = absl::Now() + w.timeout;
  for (std::string& k : MissingKeys(w.keys)) {
    waiters_[k].insert(c.id);
    c.missing.insert(std::move(k));
  }
  c.wait = std::move(w);
}

void TcpStoreServer::Loop::Unpark(Conn& c) {
  for (const std::string& k : c.missing) {
    auto it = waiters_.find(k);
    if (it == waiters_.end()) continue;
    it->second.erase(c.id);
    if (it->second.empty()) waiters_.erase(it);
  }
  c.missing.clear();
  c.wait.reset();
}

void TcpStoreServer::Loop::KeySet(const std::string& key) {
  auto found = waiters_.find(key);
  if (found == waiters_.end()) return;
  const std::set<uint64_t> ids = std::move(found->second);
  waiters_.erase(found);
  for (uint64_t id : ids) {
    auto it = conns_.find(id);
    if (it == conns_.end() || !it->second->wait.has_value()) continue;
    Conn& w = *it->second;
    w.missing.erase(key);
    if (!w.missing.empty()) continue;
    // Every key was seen set; check again in case one was deleted since.
    for (std::string& k : MissingKeys(w.wait->keys)) {
      waiters_[k].insert(w.id);
      w.missing.insert(std::move(k));
    }
    if (!w.missing.empty()) continue;
    const std::string body =
        w.wait->op == StoreOp::kGet ? map_.at(w.wait->keys.front()) : std::string();
    w.wait.reset();
    if (Reply(w, absl::OkStatus(), body)) Refresh(w);
  }
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
  if (!listen.ok()) {
    return absl::Status(listen.status().code(),
                        absl::StrCat("TcpStore server: ", listen.status().message()));
  }
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
  ev.data.u64 = kListenTag;
  if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, listen->get(), &ev) != 0) {
    return absl::InternalError(absl::StrCat(where, ": epoll_ctl: ", core::ErrnoText(errno)));
  }
  ev.data.u64 = kWakeTag;
  if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, wake.get(), &ev) != 0) {
    return absl::InternalError(absl::StrCat(where, ": epoll_ctl: ", core::ErrnoText(errno)));
  }
  std::string nonce_key;
  if (!options.secret.empty()) {
    nonce_key.resize(kSha256Bytes);
    if (::getrandom(nonce_key.data(), nonce_key.size(), 0) !=
        static_cast<ssize_t>(nonce_key.size())) {
      return absl::InternalError(absl::StrCat(where, ": getrandom failed: ", core::ErrnoText(errno)));
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
