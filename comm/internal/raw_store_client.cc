#include "comm/internal/raw_store_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/internal/sha256.h"
#include "core/status_macros.h"

namespace comm {
namespace internal {

absl::StatusOr<RawStoreClient> RawStoreClient::Connect(int port, bool read_greeting,
                                                       absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<Fd> fd = ConnectOnce("127.0.0.1", port, deadline);
  if (!fd.ok()) return fd.status();
  RawStoreClient client(*std::move(fd));
  if (!read_greeting) return client;
  absl::StatusOr<std::string> greeting = RecvFrame(client.fd(), kStoreMaxHandshakeBytes, deadline);
  if (!greeting.ok()) return greeting.status();
  absl::StatusOr<Hello> hello = ParseHello(*greeting);
  if (!hello.ok()) return hello.status();
  client.hello_ = *std::move(hello);
  return client;
}

absl::Status RawStoreClient::Authenticate(absl::string_view secret, absl::Duration timeout) {
  AuthProof proof;
  proof.client_nonce = std::string(kStoreNonceBytes, '\x42');
  proof.mac = ClientProof(secret, hello_.nonce, proof.client_nonce);
  RETURN_IF_ERROR(SendRaw(EncodeFrame(EncodeAuthProof(proof)), timeout));
  absl::StatusOr<Reply> reply = Receive(timeout);
  if (!reply.ok()) return reply.status();
  if (!reply->status.ok()) return reply->status;
  if (reply->body != ServerProof(secret, hello_.nonce, proof.client_nonce)) {
    return absl::InternalError("the server's proof does not match the secret");
  }
  return absl::OkStatus();
}

absl::Status RawStoreClient::SendRaw(absl::string_view bytes, absl::Duration timeout) {
  return SendAll(fd(), bytes.data(), bytes.size(), absl::Now() + timeout);
}

absl::Status RawStoreClient::Send(const Request& request) {
  return SendRaw(EncodeFrame(EncodeRequest(request)));
}

absl::StatusOr<Reply> RawStoreClient::Receive(absl::Duration timeout) {
  absl::StatusOr<std::string> frame = RecvFrame(fd(), size_t{1} << 30, absl::Now() + timeout);
  if (!frame.ok()) return frame.status();
  return ParseReply(*frame);
}

bool RawStoreClient::ClosedByServerWithin(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  char buf[4096];
  while (true) {
    const ssize_t n = ::recv(fd(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
    if (n > 0) continue;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd p{fd(), POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
  }
}

void RawStoreClient::CloseWithReset() {
  if (!fd_.valid()) return;
  linger l{1, 0};
  ::setsockopt(fd(), SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  fd_.Reset();
}

}  // namespace internal
}  // namespace comm
