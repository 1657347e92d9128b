// Test-only: a TcpStore client that speaks the wire protocol by hand, so tests can do
// what a well-behaved TcpStore never does: skip or fake the handshake, announce frames
// and stall, send garbage, hold many connections without a thread each.
//
//   auto raw = internal::RawStoreClient::Connect(port).value();   // greeting read
//   ASSERT_TRUE(raw.Authenticate("secret").ok());
//   ASSERT_TRUE(raw.SendRaw(EncodeFrame(EncodeRequest(get))).ok());
//   absl::StatusOr<Reply> reply = raw.Receive(absl::Seconds(5));
#ifndef COMM_INTERNAL_RAW_STORE_CLIENT_H_
#define COMM_INTERNAL_RAW_STORE_CLIENT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/internal/socket.h"
#include "comm/internal/store_protocol.h"

namespace comm {
namespace internal {

class RawStoreClient {
 public:
  // Connects to 127.0.0.1:port and, if `read_greeting`, reads the server's Hello.
  static absl::StatusOr<RawStoreClient> Connect(int port, bool read_greeting = true,
                                                absl::Duration timeout = absl::Seconds(10));

  const Hello& hello() const { return hello_; }
  int fd() const { return fd_.get(); }

  // Answers the greeting's challenge with `secret` and returns the server's verdict
  // (PermissionDenied for a wrong secret, Internal if the server's proof is wrong).
  absl::Status Authenticate(absl::string_view secret, absl::Duration timeout = absl::Seconds(10));
  // Writes `bytes` as they are.
  absl::Status SendRaw(absl::string_view bytes, absl::Duration timeout = absl::Seconds(10));
  // Sends `request` in a frame.
  absl::Status Send(const Request& request);
  // Reads one reply frame.
  absl::StatusOr<Reply> Receive(absl::Duration timeout);
  // Whether the server closes the connection (EOF or reset) within `timeout`; whatever
  // it sends before that is read and dropped.
  bool ClosedByServerWithin(absl::Duration timeout);
  // Closes with a reset (SO_LINGER 0) rather than a FIN, leaving no TIME_WAIT behind.
  void CloseWithReset();

 private:
  explicit RawStoreClient(Fd fd) : fd_(std::move(fd)) {}
  Fd fd_;
  Hello hello_;
};

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_RAW_STORE_CLIENT_H_
