// The TcpStore server: one event-loop thread (epoll) serving every connection, with
// bounded resources whatever the clients do. TcpStore (comm/tcp_store.h) starts it on
// rank 0; nothing else should need it directly.
//
//   internal::TcpStoreServerOptions o;
//   o.secret = job_secret;                          // empty: no authentication
//   ASSIGN_OR_RETURN(auto server, internal::TcpStoreServer::Start(o));
//   // ... clients connect to o.host:server->port() ...
//   server.reset();                                 // closes every connection
//
// Bounds (NOTE [TcpStore server bounds]):
// - threads: one, for any number of connections and blocked Get/Wait requests (a
//   request that waits for keys is parked in a list and answered when its keys are set
//   or its deadline passes);
// - connections: at most `max_connections`; a connection beyond that is closed at once;
// - messages: a frame may announce at most `max_frame_bytes` (bigger: InvalidArgument
//   reply, then the connection is closed); buffers grow as bytes arrive, never ahead;
// - memory: partial messages of all connections together hold at most
//   `max_buffered_bytes` received bytes; the connection whose bytes would pass it gets a
//   ResourceExhausted reply and is closed;
// - time: a message (or the handshake) that does not complete within
//   `partial_message_timeout` of its first byte (of the connection, for the handshake)
//   drops the connection; so does a reply the client does not read within it. An idle
//   connection between messages may stay open for ever.
// With a secret, a connection must answer the challenge (comm/internal/store_protocol.h)
// before any request; a wrong answer gets PermissionDenied and the connection is closed.
#ifndef COMM_INTERNAL_TCP_STORE_SERVER_H_
#define COMM_INTERNAL_TCP_STORE_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/internal/socket.h"

namespace comm {
namespace internal {

// The server's side of TcpStoreOptions (comm/tcp_store.h documents each field).
struct TcpStoreServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  // The job secret; empty: no authentication (a warning is logged once per process).
  std::string secret;
  // Largest frame a client may announce after the handshake.
  size_t max_frame_bytes = (size_t{64} << 20) + 5120;
  int max_connections = 1024;
  int64_t max_buffered_bytes = int64_t{512} << 20;
  absl::Duration partial_message_timeout = absl::Seconds(30);
};

class TcpStoreServer {
 public:
  // Binds host:port, then serves on its own thread until destroyed. Unavailable naming
  // host:port when it cannot bind.
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(
      const TcpStoreServerOptions& options);

  // Stops the loop and closes every connection (clients see the connection close).
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // The port it listens on (the one the kernel picked when options.port was 0).
  int port() const { return port_; }
  // Connections open right now, including ones being closed (for tests and logs).
  int connection_count() const;

 private:
  class Loop;
  TcpStoreServer(int port, std::unique_ptr<Loop> loop);

  const int port_;
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
};

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_TCP_STORE_SERVER_H_
