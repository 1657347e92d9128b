// TcpStore: a Store served over TCP by one process (rank 0) and used by all of them,
// which is how ranks on different hosts find each other (MASTER_ADDR:MASTER_PORT).
//
//   comm::TcpStoreOptions opts;
//   opts.host = master_addr;          // the server binds here; clients connect here
//   opts.port = master_port;          // 0 on the server: pick a free port
//   opts.is_server = (rank == 0);
//   opts.secret = job_secret;         // FSDP_JOB_SECRET; the same on every rank
//   ASSIGN_OR_RETURN(auto store, comm::TcpStore::Create(opts));
//   RETURN_IF_ERROR(store->Set("0", address));
//
// The server binds to loopback (127.0.0.1) unless another address is given, so a job
// is not reachable from the network by accident. Clients retry the connection with
// exponential backoff (10 ms doubling to 1 s) until `connect_timeout`, so ranks may
// start in any order. Every message is bounded: keys by kMaxKeyBytes, values by
// `max_value_bytes`; bigger ones are refused with InvalidArgument on either side.
// Blocking calls (Get, Wait) wait on the server, never longer than their timeout.
//
// Authentication: with a `secret`, client and server prove to each other that they know
// it (HMAC-SHA256 challenge-response, comm/internal/store_protocol.h) before any
// request; a client with no secret or another one gets PermissionDenied ("TcpStore
// host:port: authentication failed: the job secret (FSDP_JOB_SECRET) does not match")
// and can neither read nor change anything. Without a secret anyone who reaches the
// port can (the server logs a warning once).
//
// The server is one event-loop thread with bounded resources, whatever clients do
// (NOTE [TcpStore server bounds] in comm/internal/tcp_store_server.h): at most
// `max_connections` connections, `max_buffered_bytes` of partial messages, and
// `partial_message_timeout` to finish a message once it has started.
//
// The server lives as long as the TcpStore object that started it: destroy the
// server's store last. Thread-safe; requests from one TcpStore are serialised on its
// connection. Calls made for rendezvous must follow NOTE [Same order on all ranks] in
// comm/store.h.
#ifndef COMM_TCP_STORE_H_
#define COMM_TCP_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "comm/internal/socket.h"
#include "comm/store.h"

namespace comm {
namespace internal {
class TcpStoreServer;
}  // namespace internal

struct TcpStoreOptions {
  // Address of the server. The server binds to it; loopback by default.
  std::string host = "127.0.0.1";
  // Port of the server. 0 (server only) lets the kernel pick one; read it from port().
  int port = 0;
  // Whether this process runs the server (and then also talks to it as a client).
  bool is_server = false;
  // The job secret (FSDP_JOB_SECRET), the same on the server and every client. Empty:
  // no authentication, as torchrun-style launches without a secret expect.
  std::string secret;
  // How long a client keeps retrying to reach the server.
  absl::Duration connect_timeout = absl::Seconds(60);
  // How long a request that does not wait (Set, Add, Check, DeleteKey) may take.
  absl::Duration request_timeout = absl::Seconds(60);
  // Largest value accepted, in bytes.
  int64_t max_value_bytes = int64_t{64} << 20;
  // Server only: most connections open at once (a rank keeps one for the job); more are
  // closed as soon as they are accepted. The process's descriptor limit applies too.
  int max_connections = 1024;
  // Server only: most bytes of partial messages held for all connections together
  // (memory held is at most twice this); a message that would pass it is refused with
  // ResourceExhausted and its connection closed.
  int64_t max_buffered_bytes = int64_t{512} << 20;
  // Server only: a message, a reply or the authentication that has started but not
  // finished within this drops the connection. Idle connections are kept.
  absl::Duration partial_message_timeout = absl::Seconds(30);
};

class TcpStore : public Store {
 public:
  // Longest key accepted, in bytes.
  static constexpr int64_t kMaxKeyBytes = 4096;
  // Most keys in one Wait or Check.
  static constexpr int64_t kMaxKeysPerRequest = 65536;

  // Starts the server if `options.is_server`, then connects to it (retrying until
  // connect_timeout: DeadlineExceeded naming host:port and the last error).
  // PermissionDenied, at once, when the secrets do not match; InvalidArgument naming the
  // option when one is out of range.
  static absl::StatusOr<std::shared_ptr<TcpStore>> Create(const TcpStoreOptions& options);
  ~TcpStore() override;

  // The server's port (the one picked when options.port was 0).
  int port() const { return port_; }
  const std::string& host() const { return options_.host; }

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override;
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override;
  // "the store at <host>:<port>" (the server's address, as clients reach it).
  std::string Describe() const override {
    return absl::StrCat("the store at ", options_.host, ":", port_);
  }

  // Server only (0 elsewhere): connections the server has open right now, this
  // store's own included. For tests and diagnostics.
  int ServerConnectionCount() const;

 private:
  explicit TcpStore(const TcpStoreOptions& options);

  absl::Status Connect(absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads the server's greeting on `fd` and, with a secret, authenticates both ways.
  absl::Status Handshake(int fd, absl::Time deadline) const;
  // Sends one request and returns the response body after its status.
  absl::StatusOr<std::string> Call(absl::string_view request, absl::Duration wait);
  absl::Status CheckKey(absl::string_view key) const;
  // "TcpStore host:port".
  std::string Where() const;

  TcpStoreOptions options_;
  int port_ = 0;
  std::unique_ptr<internal::TcpStoreServer> server_;
  absl::Mutex mu_;
  internal::Fd conn_ ABSL_GUARDED_BY(mu_);
};

}  // namespace comm

#endif  // COMM_TCP_STORE_H_
