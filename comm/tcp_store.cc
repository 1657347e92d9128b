#include "comm/tcp_store.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/internal/sha256.h"
#include "comm/internal/store_protocol.h"
#include "comm/internal/tcp_store_server.h"
#include "core/errno_text.h"
#include "core/status_macros.h"

namespace comm {

static_assert(TcpStore::kMaxKeyBytes == internal::kStoreMaxKeyBytes);
static_assert(TcpStore::kMaxKeysPerRequest == internal::kStoreMaxKeysPerRequest);

namespace {

using internal::Request;
using internal::StoreOp;

// Largest reply of the handshake (the server's proof or its error message).
constexpr size_t kMaxHandshakeReplyBytes = 4096;

size_t MaxFrame(const TcpStoreOptions& o) {
  return static_cast<size_t>(o.max_value_bytes) + internal::kStoreFrameOverhead;
}

absl::StatusOr<std::string> RandomBytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(out.data() + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      return absl::InternalError(absl::StrCat("getrandom failed: ", core::ErrnoText(errno)));
    }
    got += static_cast<size_t>(r);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::shared_ptr<TcpStore>> TcpStore::Create(const TcpStoreOptions& options) {
  if (options.max_value_bytes < 0 || options.max_value_bytes > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TcpStoreOptions.max_value_bytes must be in [0, 2 GiB]; got ", options.max_value_bytes));
  }
  if (!options.is_server && options.port <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TcpStoreOptions.port must name the server's port on a client; got ", options.port));
  }
  if (options.is_server) {
    if (options.max_connections < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TcpStoreOptions.max_connections must be >= 1 (the server's own store connects "
          "too); got ",
          options.max_connections));
    }
    if (options.max_buffered_bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TcpStoreOptions.max_buffered_bytes must be >= 0; got ", options.max_buffered_bytes));
    }
    if (options.partial_message_timeout <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("TcpStoreOptions.partial_message_timeout must be positive; got ",
                       absl::FormatDuration(options.partial_message_timeout)));
    }
  }
  std::shared_ptr<TcpStore> store(new TcpStore(options));
  store->port_ = options.port;
  if (options.is_server) {
    internal::TcpStoreServerOptions so;
    so.host = options.host;
    so.port = options.port;
    so.secret = options.secret;
    so.max_frame_bytes = MaxFrame(options);
    so.max_connections = options.max_connections;
    so.max_buffered_bytes = options.max_buffered_bytes;
    so.partial_message_timeout = options.partial_message_timeout;
    absl::StatusOr<std::unique_ptr<internal::TcpStoreServer>> server =
        internal::TcpStoreServer::Start(so);
    if (!server.ok()) return server.status();
    store->server_ = *std::move(server);
    store->port_ = store->server_->port();
  }
  absl::MutexLock lock(&store->mu_);
  RETURN_IF_ERROR(store->Connect(options.connect_timeout));
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

int TcpStore::ServerConnectionCount() const {
  return server_ == nullptr ? 0 : server_->connection_count();
}

std::string TcpStore::Where() const { return absl::StrCat("TcpStore ", options_.host, ":", port_); }

absl::Status TcpStore::Connect(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(10);
  absl::Status last;
  while (true) {
    const absl::Time attempt_deadline = std::min(deadline, absl::Now() + absl::Seconds(5));
    absl::StatusOr<internal::Fd> fd = internal::ConnectOnce(options_.host, port_, attempt_deadline);
    if (fd.ok()) {
      absl::Status shaken = Handshake(fd->get(), attempt_deadline);
      if (shaken.ok()) {
        conn_ = *std::move(fd);
        return absl::OkStatus();
      }
      // A wrong secret or a stranger on the port does not get better by retrying.
      if (absl::IsPermissionDenied(shaken) || absl::IsFailedPrecondition(shaken) ||
          absl::IsInternal(shaken)) {
        return shaken;
      }
      last = shaken;  // e.g. the server was at its connection limit and hung up
    } else {
      if (absl::IsInvalidArgument(fd.status())) return fd.status();  // unresolvable host
      last = fd.status();
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    absl::SleepFor(std::min(backoff, left));
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("TcpStore: could not reach the server at ", options_.host, ":", port_,
                   " within ", absl::FormatDuration(timeout), ": ", last.message()));
}

absl::Status TcpStore::Handshake(int fd, absl::Time deadline) const {
  const std::string where = Where();
  absl::StatusOr<std::string> greeting =
      internal::RecvFrame(fd, internal::kStoreMaxHandshakeBytes, deadline);
  if (!greeting.ok()) {
    return absl::UnavailableError(
        absl::StrCat(where, ": no greeting from the server: ", greeting.status().message()));
  }
  absl::StatusOr<internal::Hello> hello = internal::ParseHello(*greeting);
  if (!hello.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(where, ": ", hello.status().message()));
  }
  if (!hello->auth_required) {
    if (!options_.secret.empty()) {
      // Talking on would hand this rank's data to a server that may not be the job's.
      return absl::PermissionDeniedError(
          absl::StrCat(where,
                       ": authentication failed: the job secret (FSDP_JOB_SECRET) does not match: "
                       "this process has one but the server does not ask for it"));
    }
    return absl::OkStatus();
  }
  if (options_.secret.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat(where,
                     ": authentication failed: the job secret (FSDP_JOB_SECRET) does not match: "
                     "the server requires one and this process has none"));
  }
  absl::StatusOr<std::string> client_nonce = RandomBytes(internal::kStoreNonceBytes);
  if (!client_nonce.ok()) {
    return absl::InternalError(absl::StrCat(where, ": ", client_nonce.status().message()));
  }
  internal::AuthProof proof;
  proof.client_nonce = *client_nonce;
  proof.mac = internal::ClientProof(options_.secret, hello->nonce, *client_nonce);
  absl::Status sent = internal::SendFrame(fd, internal::EncodeAuthProof(proof), deadline);
  absl::StatusOr<std::string> answer =
      sent.ok() ? internal::RecvFrame(fd, kMaxHandshakeReplyBytes, deadline)
                : absl::StatusOr<std::string>(sent);
  if (!answer.ok()) {
    return absl::UnavailableError(
        absl::StrCat(where, ": authentication interrupted: ", answer.status().message()));
  }
  absl::StatusOr<internal::Reply> reply = internal::ParseReply(*answer);
  if (!reply.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(where, ": ", reply.status().message()));
  }
  if (absl::IsPermissionDenied(reply->status)) {
    return absl::PermissionDeniedError(absl::StrCat(
        where, ": authentication failed: the job secret (FSDP_JOB_SECRET) does not match"));
  }
  if (!reply->status.ok()) {
    return core::Annotate(reply->status, absl::StrCat(where, ": authentication"));
  }
  if (!internal::ConstantTimeEquals(
          reply->body, internal::ServerProof(options_.secret, hello->nonce, *client_nonce))) {
    return absl::PermissionDeniedError(
        absl::StrCat(where,
                     ": authentication failed: the job secret (FSDP_JOB_SECRET) does not match: "
                     "the server could not prove it knows this process's secret"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> TcpStore::Call(absl::string_view request, absl::Duration wait) {
  if (request.size() > MaxFrame(options_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("TcpStore: request of ", request.size(),
                     " bytes exceeds the message limit (max_value_bytes ", options_.max_value_bytes,
                     " + ", internal::kStoreFrameOverhead, ")"));
  }
  absl::MutexLock lock(&mu_);
  if (!conn_.valid()) {
    // The last request failed mid-way; its reply cannot be trusted, so start afresh.
    RETURN_IF_ERROR(Connect(options_.connect_timeout));
  }
  const std::string where = absl::StrCat(options_.host, ":", port_);
  const absl::Time deadline = absl::Now() + wait + options_.request_timeout;
  absl::Status sent = internal::SendFrame(conn_.get(), request, deadline);
  absl::StatusOr<std::string> frame =
      sent.ok() ? internal::RecvFrame(conn_.get(), MaxFrame(options_), deadline)
                : absl::StatusOr<std::string>(sent);
  if (!frame.ok()) {
    conn_.Reset();
    const absl::StatusCode code = absl::IsDeadlineExceeded(frame.status())
                                      ? absl::StatusCode::kDeadlineExceeded
                                      : absl::StatusCode::kUnavailable;
    return absl::Status(code, absl::StrCat("TcpStore: request to the server at ", where,
                                           " failed: ", frame.status().message()));
  }
  absl::StatusOr<internal::Reply> reply = internal::ParseReply(*frame);
  if (!reply.ok()) {
    conn_.Reset();
    return absl::InternalError(absl::StrCat("TcpStore: ", reply.status().message(), " at ", where));
  }
  if (!reply->status.ok()) return reply->status;
  return std::move(reply->body);
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
  RETURN_IF_ERROR(CheckKey(key));
  if (static_cast<int64_t>(value.size()) > options_.max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TcpStore: value of ", value.size(), " bytes for key \"", key,
        "\" exceeds TcpStoreOptions.max_value_bytes (", options_.max_value_bytes, ")"));
  }
  Request r;
  r.op = StoreOp::kSet;
  r.key = std::string(key);
  r.value = std::string(value);
  return Call(internal::EncodeRequest(r), absl::ZeroDuration()).status();
}

absl::StatusOr<std::string> TcpStore::Get(absl::string_view key, absl::Duration timeout) {
  RETURN_IF_ERROR(CheckKey(key));
  Request r;
  r.op = StoreOp::kGet;
  r.key = std::string(key);
  r.timeout_ms = absl::ToInt64Milliseconds(timeout);
  return Call(internal::EncodeRequest(r), timeout);
}

absl::StatusOr<int64_t> TcpStore::Add(absl::string_view key, int64_t delta) {
  RETURN_IF_ERROR(CheckKey(key));
  Request r;
  r.op = StoreOp::kAdd;
  r.key = std::string(key);
  r.delta = delta;
  absl::StatusOr<std::string> body = Call(internal::EncodeRequest(r), absl::ZeroDuration());
  if (!body.ok()) return body.status();
  absl::StatusOr<int64_t> value = internal::ParseI64(*body);
  if (!value.ok()) {
    return absl::InternalError(
        absl::StrCat(Where(), ": malformed Add(\"", key, "\") reply: ", value.status().message()));
  }
  return *value;
}

absl::Status TcpStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  if (static_cast<int64_t>(keys.size()) > kMaxKeysPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat("TcpStore: Wait on ", keys.size(),
                                                   " keys exceeds kMaxKeysPerRequest (",
                                                   kMaxKeysPerRequest, ")"));
  }
  for (const std::string& k : keys) {
    RETURN_IF_ERROR(CheckKey(k));
  }
  Request r;
  r.op = StoreOp::kWait;
  r.keys = keys;
  r.timeout_ms = absl::ToInt64Milliseconds(timeout);
  return Call(internal::EncodeRequest(r), timeout).status();
}

absl::StatusOr<bool> TcpStore::Check(const std::vector<std::string>& keys) {
  if (static_cast<int64_t>(keys.size()) > kMaxKeysPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat("TcpStore: Check on ", keys.size(),
                                                   " keys exceeds kMaxKeysPerRequest (",
                                                   kMaxKeysPerRequest, ")"));
  }
  for (const std::string& k : keys) {
    RETURN_IF_ERROR(CheckKey(k));
  }
  Request r;
  r.op = StoreOp::kCheck;
  r.keys = keys;
  absl::StatusOr<std::string> body = Call(internal::EncodeRequest(r), absl::ZeroDuration());
  if (!body.ok()) return body.status();
  absl::StatusOr<bool> v = internal::ParseBool(*body);
  if (!v.ok()) {
    return absl::InternalError(
        absl::StrCat(Where(), ": malformed Check reply: ", v.status().message()));
  }
  return *v;
}

absl::StatusOr<bool> TcpStore::DeleteKey(absl::string_view key) {
  RETURN_IF_ERROR(CheckKey(key));
  Request r;
  r.op = StoreOp::kDelete;
  r.key = std::string(key);
  absl::StatusOr<std::string> body = Call(internal::EncodeRequest(r), absl::ZeroDuration());
  if (!body.ok()) return body.status();
  absl::StatusOr<bool> v = internal::ParseBool(*body);
  if (!v.ok()) {
    return absl::InternalError(absl::StrCat(Where(), ": malformed DeleteKey(\"", key,
                                            "\") reply: ", v.status().message()));
  }
  return *v;
}

}  // namespace comm
