#include "comm/tcp_store.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "comm/internal/store_util.h"
#include "glog/logging.h"

namespace comm {
namespace {

enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kWait = 4, kCheck = 5, kDelete = 6 };

// Room in a frame for everything but the value: op, lengths, key, timeout.
constexpr size_t kFrameOverhead = TcpStore::kMaxKeyBytes + 1024;

class Writer {
 public:
  Writer& U8(uint8_t v) {
    out_.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& I64(int64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff));
    return *this;
  }
  Writer& Str(absl::string_view s) {
    const uint32_t n = static_cast<uint32_t>(s.size());
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    out_.append(s.data(), s.size());
    return *this;
  }
  std::string Take() { return std::move(out_); }
  size_t size() const { return out_.size(); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  bool U8(uint8_t* v) {
    if (in_.size() < 1) return false;
    *v = static_cast<uint8_t>(in_[0]);
    in_.remove_prefix(1);
    return true;
  }
  bool I64(int64_t* v) {
    if (in_.size() < 8) return false;
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= static_cast<uint64_t>(static_cast<uint8_t>(in_[i])) << (8 * i);
    *v = static_cast<int64_t>(u);
    in_.remove_prefix(8);
    return true;
  }
  bool Str(std::string* s) {
    if (in_.size() < 4) return false;
    uint32_t n = 0;
    for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(static_cast<uint8_t>(in_[i])) << (8 * i);
    in_.remove_prefix(4);
    if (in_.size() < n) return false;
    s->assign(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  bool done() const { return in_.empty(); }

 private:
  absl::string_view in_;
};

std::string StatusResponse(const absl::Status& s, absl::string_view body = "") {
  Writer w;
  w.U8(static_cast<uint8_t>(s.code()));
  w.Str(s.ok() ? body : absl::string_view(s.message()));
  return w.Take();
}

}  // namespace

// The server: an accept thread plus one thread per connection, over a map guarded by a
// mutex. Get and Wait block their connection's thread (never the others) until the
// keys are set, the request's timeout passes, or the server stops.
class TcpStore::Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Start(const std::string& host, int port,
                                                       size_t max_frame) {
    absl::StatusOr<internal::Fd> fd = internal::Listen(host, port);
    if (!fd.ok()) {
      return absl::Status(fd.status().code(),
                          absl::StrCat("TcpStore server: ", fd.status().message()));
    }
    absl::StatusOr<int> bound = internal::BoundPort(fd->get());
    if (!bound.ok()) return bound.status();
    std::unique_ptr<Server> server(new Server(std::move(*fd), *bound, max_frame));
    if (::pipe2(server->wake_, O_CLOEXEC) != 0) {
      return absl::InternalError("TcpStore server: pipe2 failed");
    }
    server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
    return server;
  }

  ~Server() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    const char byte = 1;
    if (wake_[1] >= 0) (void)!::write(wake_[1], &byte, 1);
    if (accept_thread_.joinable()) accept_thread_.join();
    std::vector<std::thread> threads;
    {
      absl::MutexLock lock(&conns_mu_);
      for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
    if (wake_[0] >= 0) ::close(wake_[0]);
    if (wake_[1] >= 0) ::close(wake_[1]);
  }

  int port() const { return port_; }

 private:
  Server(internal::Fd listen, int port, size_t max_frame)
      : listen_(std::move(listen)), port_(port), max_frame_(max_frame) {}

  void AcceptLoop() {
    while (true) {
      pollfd fds[2] = {{listen_.get(), POLLIN, 0}, {wake_[0], POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        LOG(ERROR) << "TcpStore server: poll failed; no longer accepting";
        return;
      }
      if (fds[1].revents != 0) return;
      if ((fds[0].revents & POLLIN) == 0) continue;
      const int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      absl::MutexLock lock(&conns_mu_);
      open_fds_.insert(fd);
      threads_.emplace_back([this, fd] { Serve(fd); });
    }
  }

  void Serve(int fd) {
    while (true) {
      absl::StatusOr<std::string> request =
          internal::RecvFrame(fd, max_frame_, absl::InfiniteFuture());
      if (!request.ok()) {
        if (absl::IsInvalidArgument(request.status())) {
          // Over the size bound: say why, then drop the connection (its body is unread).
          (void)internal::SendFrame(
              fd, StatusResponse(absl::InvalidArgumentError(absl::StrCat(
                      "TcpStore server: ", request.status().message()))),
              absl::Now() + absl::Seconds(5));
        }
        break;
      }
      const std::string response = Handle(*request);
      if (!internal::SendFrame(fd, response, absl::Now() + absl::Seconds(60)).ok()) break;
    }
    absl::MutexLock lock(&conns_mu_);
    open_fds_.erase(fd);
    ::close(fd);
  }

  bool HasAll(const std::vector<std::string>& keys) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const std::string& k : keys) {
      if (map_.find(k) == map_.end()) return false;
    }
    return true;
  }

  // Waits for `keys`; false on timeout or when the server stops.
  bool AwaitKeys(const std::vector<std::string>& keys, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || HasAll(keys); };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    return !stopping_ && HasAll(keys);
  }

  std::string Handle(const std::string& request) {
    Reader r(request);
    uint8_t op = 0;
    const absl::Status malformed =
        absl::InvalidArgumentError("TcpStore server: malformed request");
    if (!r.U8(&op)) return StatusResponse(malformed);
    std::string key, value;
    int64_t number = 0;
    absl::MutexLock lock(&mu_);
    switch (op) {
      case kSet:
        if (!r.Str(&key) || !r.Str(&value) || !r.done()) return StatusResponse(malformed);
        map_[key] = std::move(value);
        return StatusResponse(absl::OkStatus());
      case kGet:
        if (!r.Str(&key) || !r.I64(&number) || !r.done()) return StatusResponse(malformed);
        if (!AwaitKeys({key}, absl::Milliseconds(number))) {
          return StatusResponse(internal::WaitTimedOut("TcpStore", {key}, absl::Milliseconds(number)));
        }
        return StatusResponse(absl::OkStatus(), map_[key]);
      case kAdd: {
        if (!r.Str(&key) || !r.I64(&number) || !r.done()) return StatusResponse(malformed);
        auto it = map_.find(key);
        absl::StatusOr<int64_t> sum = internal::AddToCounter(
            "TcpStore", key, it == map_.end() ? nullptr : &it->second, number);
        if (!sum.ok()) return StatusResponse(sum.status());
        map_[key] = absl::StrCat(*sum);
        return StatusResponse(absl::OkStatus(), Writer().I64(*sum).Take());
      }
      case kWait:
      case kCheck: {
        int64_t n = 0;
        if (!r.I64(&n) || n < 0 || n > kMaxKeysPerRequest) return StatusResponse(malformed);
        std::vector<std::string> keys(n);
        for (std::string& k : keys) {
          if (!r.Str(&k)) return StatusResponse(malformed);
        }
        if (op == kCheck) {
          if (!r.done()) return StatusResponse(malformed);
          return StatusResponse(absl::OkStatus(), Writer().U8(HasAll(keys) ? 1 : 0).Take());
        }
        if (!r.I64(&number) || !r.done()) return StatusResponse(malformed);
        if (!AwaitKeys(keys, absl::Milliseconds(number))) {
          std::vector<std::string> missing;
          for (const std::string& k : keys) {
            if (map_.find(k) == map_.end()) missing.push_back(k);
          }
          return StatusResponse(
              internal::WaitTimedOut("TcpStore", missing, absl::Milliseconds(number)));
        }
        return StatusResponse(absl::OkStatus());
      }
      case kDelete:
        if (!r.Str(&key) || !r.done()) return StatusResponse(malformed);
        return StatusResponse(absl::OkStatus(), Writer().U8(map_.erase(key) ? 1 : 0).Take());
      default:
        return StatusResponse(
            absl::InvalidArgumentError(absl::StrCat("TcpStore server: unknown op ", op)));
    }
  }

  internal::Fd listen_;
  const int port_;
  const size_t max_frame_;
  int wake_[2] = {-1, -1};
  std::thread accept_thread_;

  absl::Mutex conns_mu_;
  std::set<int> open_fds_ ABSL_GUARDED_BY(conns_mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(conns_mu_);

  absl::Mutex mu_;
  std::map<std::string, std::string> map_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

absl::StatusOr<std::shared_ptr<TcpStore>> TcpStore::Create(const TcpStoreOptions& options) {
  if (options.max_value_bytes < 0) {
    return absl::InvalidArgumentError("TcpStoreOptions.max_value_bytes must be >= 0");
  }
  if (!options.is_server && options.port <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TcpStoreOptions.port must name the server's port on a client; got ", options.port));
  }
  std::shared_ptr<TcpStore> store(new TcpStore(options));
  store->port_ = options.port;
  if (options.is_server) {
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(
        options.host, options.port, static_cast<size_t>(options.max_value_bytes) + kFrameOverhead);
    if (!server.ok()) return server.status();
    store->server_ = *std::move(server);
    store->port_ = store->server_->port();
  }
  absl::MutexLock lock(&store->mu_);
  absl::Status connected = store->Connect(options.connect_timeout);
  if (!connected.ok()) return connected;
  return store;
}

TcpStore::TcpStore(const TcpStoreOptions& options) : options_(options) {}

TcpStore::~TcpStore() {
  {
    absl::MutexLock lock(&mu_);
    conn_.Reset();
  }
  server_.reset();
}

absl::Status TcpStore::Connect(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(10);
  absl::Status last;
  while (true) {
    const absl::Time attempt_deadline = std::min(deadline, absl::Now() + absl::Seconds(5));
    absl::StatusOr<internal::Fd> fd = internal::ConnectOnce(options_.host, port_, attempt_deadline);
    if (fd.ok()) {
      conn_ = *std::move(fd);
      return absl::OkStatus();
    }
    if (absl::IsInvalidArgument(fd.status())) return fd.status();  // unresolvable host
    last = fd.status();
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    absl::SleepFor(std::min(backoff, left));
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
  return absl::DeadlineExceededError(absl::StrCat("TcpStore: could not reach the server at ",
                                                  options_.host, ":", port_, " within ",
                                                  absl::FormatDuration(timeout), ": ",
                                                  last.message()));
}

absl::StatusOr<std::string> TcpStore::Call(absl::string_view request, absl::Duration wait) {
  if (request.size() > static_cast<size_t>(options_.max_value_bytes) + kFrameOverhead) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TcpStore: request of ", request.size(), " bytes exceeds the message limit (max_value_bytes ",
        options_.max_value_bytes, " + ", kFrameOverhead, ")"));
  }
  absl::MutexLock lock(&mu_);
  if (!conn_.valid()) {
    // The last request failed mid-way; its reply cannot be trusted, so start afresh.
    absl::Status connected = Connect(options_.connect_timeout);
    if (!connected.ok()) return connected;
  }
  const std::string where = absl::StrCat(options_.host, ":", port_);
  const absl::Time deadline = absl::Now() + wait + options_.request_timeout;
  absl::Status sent = internal::SendFrame(conn_.get(), request, deadline);
  absl::StatusOr<std::string> reply =
      sent.ok() ? internal::RecvFrame(conn_.get(),
                                      static_cast<size_t>(options_.max_value_bytes) + kFrameOverhead,
                                      deadline)
                : absl::StatusOr<std::string>(sent);
  if (!reply.ok()) {
    conn_.Reset();
    const absl::StatusCode code = absl::IsDeadlineExceeded(reply.status())
                                      ? absl::StatusCode::kDeadlineExceeded
                                      : absl::StatusCode::kUnavailable;
    return absl::Status(code, absl::StrCat("TcpStore: request to the server at ", where,
                                           " failed: ", reply.status().message()));
  }
  Reader r(*reply);
  uint8_t code = 0;
  std::string body;
  if (!r.U8(&code) || !r.Str(&body) || !r.done()) {
    conn_.Reset();
    return absl::InternalError(absl::StrCat("TcpStore: malformed reply from ", where));
  }
  if (code != 0) return absl::Status(static_cast<absl::StatusCode>(code), body);
  return body;
}

absl::Status TcpStore::CheckKey(absl::string_view key) const {
  if (static_cast<int64_t>(key.size()) > kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("TcpStore: key of ", key.size(),
                                                   " bytes exceeds kMaxKeyBytes (", kMaxKeyBytes,
                                                   "): \"", key.substr(0, 40), "...\""));
  }
  return absl::OkStatus();
}

absl::Status TcpStore::Set(absl::string_view key, absl::string_view value) {
  absl::Status k = CheckKey(key);
  if (!k.ok()) return k;
  if (static_cast<int64_t>(value.size()) > options_.max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TcpStore: value of ", value.size(), " bytes for key \"", key,
        "\" exceeds TcpStoreOptions.max_value_bytes (", options_.max_value_bytes, ")"));
  }
  return Call(Writer().U8(kSet).Str(key).Str(value).Take(), absl::ZeroDuration()).status();
}

absl::StatusOr<std::string> TcpStore::Get(absl::string_view key, absl::Duration timeout) {
  absl::Status k = CheckKey(key);
  if (!k.ok()) return k;
  return Call(Writer().U8(kGet).Str(key).I64(absl::ToInt64Milliseconds(timeout)).Take(), timeout);
}

absl::StatusOr<int64_t> TcpStore::Add(absl::string_view key, int64_t delta) {
  absl::Status k = CheckKey(key);
  if (!k.ok()) return k;
  absl::StatusOr<std::string> body =
      Call(Writer().U8(kAdd).Str(key).I64(delta).Take(), absl::ZeroDuration());
  if (!body.ok()) return body.status();
  int64_t value = 0;
  if (!Reader(*body).I64(&value)) return absl::InternalError("TcpStore: malformed Add reply");
  return value;
}

absl::Status TcpStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  if (static_cast<int64_t>(keys.size()) > kMaxKeysPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat("TcpStore: Wait on ", keys.size(),
                                                   " keys exceeds kMaxKeysPerRequest (",
                                                   kMaxKeysPerRequest, ")"));
  }
  Writer w;
  w.U8(kWait).I64(static_cast<int64_t>(keys.size()));
  for (const std::string& k : keys) {
    absl::Status s = CheckKey(k);
    if (!s.ok()) return s;
    w.Str(k);
  }
  w.I64(absl::ToInt64Milliseconds(timeout));
  return Call(w.Take(), timeout).status();
}

absl::StatusOr<bool> TcpStore::Check(const std::vector<std::string>& keys) {
  if (static_cast<int64_t>(keys.size()) > kMaxKeysPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat("TcpStore: Check on ", keys.size(),
                                                   " keys exceeds kMaxKeysPerRequest (",
                                                   kMaxKeysPerRequest, ")"));
  }
  Writer w;
  w.U8(kCheck).I64(static_cast<int64_t>(keys.size()));
  for (const std::string& k : keys) {
    absl::Status s = CheckKey(k);
    if (!s.ok()) return s;
    w.Str(k);
  }
  absl::StatusOr<std::string> body = Call(w.Take(), absl::ZeroDuration());
  if (!body.ok()) return body.status();
  uint8_t v = 0;
  if (!Reader(*body).U8(&v)) return absl::InternalError("TcpStore: malformed Check reply");
  return v != 0;
}

absl::StatusOr<bool> TcpStore::DeleteKey(absl::string_view key) {
  absl::Status k = CheckKey(key);
  if (!k.ok()) return k;
  absl::StatusOr<std::string> body = Call(Writer().U8(kDelete).Str(key).Take(), absl::ZeroDuration());
  if (!body.ok()) return body.status();
  uint8_t v = 0;
  if (!Reader(*body).U8(&v)) return absl::InternalError("TcpStore: malformed DeleteKey reply");
  return v != 0;
}

}  // namespace comm
