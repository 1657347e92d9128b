// The TcpStore wire format, as pure functions over bytes (no sockets), so the server's
// parser can be unit-tested and fuzzed on its own (comm:store_message_fuzz).
//
// Every message is a frame: a 4-byte little-endian length, then that many bytes.
//
//   server -> client  Hello        "FSDPSTORE", version, flags (auth required), 32-byte nonce
//   client -> server  AuthProof    32-byte client nonce, HMAC-SHA256 proof (only with a secret)
//   server -> client  reply        status code, then the server's proof (or the error)
//   client -> server  request      op, then its fields (see Request)
//   server -> client  reply        status code, then the body (or the error message)
//
// Integers are little-endian; strings are a 4-byte length then the bytes.
//
//   FrameAssembler in(max_bytes);
//   size_t used = in.Consume(bytes).value();   // stops at the end of a frame
//   if (in.HasFrame()) {
//     absl::StatusOr<Request> r = ParseRequest(in.TakeFrame());
//   }
#ifndef COMM_INTERNAL_STORE_PROTOCOL_H_
#define COMM_INTERNAL_STORE_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace comm {
namespace internal {

// Longest key accepted, in bytes (TcpStore::kMaxKeyBytes).
inline constexpr int64_t kStoreMaxKeyBytes = 4096;
// Most keys in one Wait or Check (TcpStore::kMaxKeysPerRequest).
inline constexpr int64_t kStoreMaxKeysPerRequest = 65536;
// Room in a frame for everything but the value: op, lengths, key, timeout.
inline constexpr size_t kStoreFrameOverhead = kStoreMaxKeyBytes + 1024;
// Size of the nonces and proofs of the handshake.
inline constexpr size_t kStoreNonceBytes = 32;
// Largest frame of the handshake (Hello, AuthProof) either side accepts.
inline constexpr size_t kStoreMaxHandshakeBytes = 256;

// Collects one frame at a time from a byte stream. Memory grows with the bytes that
// arrive (never more than twice what has arrived), not with what a header announces.
class FrameAssembler {
 public:
  explicit FrameAssembler(size_t max_frame_bytes) : max_frame_bytes_(max_frame_bytes) {}

  // Limit for frames whose header has not been read yet.
  void set_max_frame_bytes(size_t max) { max_frame_bytes_ = max; }

  // Appends the prefix of `data` that belongs to the current frame and returns its
  // length (0 once a frame is complete, until TakeFrame). InvalidArgument ("message of N
  // bytes exceeds the limit of M bytes") when the header announces more than the limit;
  // the assembler must not be used after that.
  absl::StatusOr<size_t> Consume(absl::string_view data);

  // How many more bytes the current frame needs (0 when it is complete).
  size_t BytesWanted() const;
  // Whether a complete frame waits for TakeFrame.
  bool HasFrame() const { return header_len_ == 4 && body_.size() == body_len_; }
  // Whether part of a frame (some but not all of it) has arrived.
  bool InProgress() const { return header_len_ > 0 && !HasFrame(); }
  // Whether the header is complete and body bytes are still missing (the next bytes
  // consumed are body bytes).
  bool InBody() const { return header_len_ == 4 && body_.size() < body_len_; }
  // Body bytes of the current frame that have arrived.
  size_t BodyBytes() const { return body_.size(); }
  // The length the current frame's header announced (0 before the header is complete).
  size_t AnnouncedBytes() const { return header_len_ == 4 ? body_len_ : 0; }

  // The complete frame's payload; the assembler starts on the next frame (and frees
  // the old buffer). Requires HasFrame().
  std::string TakeFrame();

 private:
  size_t max_frame_bytes_;
  unsigned char header_[4] = {0, 0, 0, 0};
  size_t header_len_ = 0;
  size_t body_len_ = 0;
  std::string body_;
};

// `payload` with its 4-byte length header.
std::string EncodeFrame(absl::string_view payload);

// The server's first frame on every connection.
struct Hello {
  // Whether the client must prove it knows the job secret before any request.
  bool auth_required = false;
  // Random bytes the client's proof covers (kStoreNonceBytes; zeros without auth).
  std::string nonce;
};
std::string EncodeHello(const Hello& hello);
// InvalidArgument when `payload` is not a Hello of this protocol version.
absl::StatusOr<Hello> ParseHello(absl::string_view payload);

// The client's answer to a Hello that asks for authentication.
struct AuthProof {
  std::string client_nonce;  // kStoreNonceBytes random bytes
  std::string mac;           // ClientProof(secret, server nonce, client_nonce)
};
std::string EncodeAuthProof(const AuthProof& proof);
// InvalidArgument when `payload` is not an AuthProof.
absl::StatusOr<AuthProof> ParseAuthProof(absl::string_view payload);

// HMAC-SHA256(secret, label || server_nonce || client_nonce), with a different label for
// each direction so that neither proof can be replayed as the other.
std::string ClientProof(absl::string_view secret, absl::string_view server_nonce,
                        absl::string_view client_nonce);
std::string ServerProof(absl::string_view secret, absl::string_view server_nonce,
                        absl::string_view client_nonce);

enum class StoreOp : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kWait = 4, kCheck = 5, kDelete = 6 };

// "Set", "Get", ...; "op N" for an unknown value.
std::string StoreOpName(StoreOp op);

struct Request {
  StoreOp op = StoreOp::kSet;
  std::string key;                // Set, Get, Add, Delete
  std::string value;              // Set
  int64_t delta = 0;              // Add
  int64_t timeout_ms = 0;         // Get, Wait
  std::vector<std::string> keys;  // Wait, Check
};

// The request's payload (without the frame header).
std::string EncodeRequest(const Request& request);

// Parses a request payload. InvalidArgument naming the op and what is wrong when the
// payload is truncated, has trailing bytes, an unknown op, a key longer than
// kStoreMaxKeyBytes or more than kStoreMaxKeysPerRequest keys. Never reads out of bounds
// and never allocates more than `payload` holds.
absl::StatusOr<Request> ParseRequest(absl::string_view payload);

// A reply payload: the status code, then `body` when ok or the error message.
std::string EncodeReply(const absl::Status& status, absl::string_view body = "");

struct Reply {
  absl::Status status;  // the server's verdict
  std::string body;     // empty unless status is ok
};
// InvalidArgument when `payload` is not a reply. An unknown status code reads as kUnknown.
absl::StatusOr<Reply> ParseReply(absl::string_view payload);

// Fixed-width little-endian fields of reply bodies.
std::string EncodeI64(int64_t v);
absl::StatusOr<int64_t> ParseI64(absl::string_view body);
std::string EncodeBool(bool v);
absl::StatusOr<bool> ParseBool(absl::string_view body);

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_STORE_PROTOCOL_H_
