#include "comm/internal/store_protocol.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/internal/sha256.h"

namespace comm {
namespace internal {
namespace {

constexpr absl::string_view kMagic = "FSDPSTORE";
constexpr uint8_t kVersion = 1;
constexpr uint8_t kFlagAuth = 1;
constexpr absl::string_view kClientLabel = "fsdp TcpStore client proof v1";
constexpr absl::string_view kServerLabel = "fsdp TcpStore server proof v1";

class Writer {
 public:
  Writer& U8(uint8_t v) {
    out_.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& I64(int64_t v) {
    const uint64_t u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
    return *this;
  }
  Writer& Str(absl::string_view s) {
    const uint32_t n = static_cast<uint32_t>(s.size());
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    out_.append(s.data(), s.size());
    return *this;
  }
  Writer& Raw(absl::string_view s) {
    out_.append(s.data(), s.size());
    return *this;
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// Reads fields front to back; each call fails (false) rather than read past the end.
class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  bool U8(uint8_t* v) {
    if (in_.empty()) return false;
    *v = static_cast<uint8_t>(in_[0]);
    in_.remove_prefix(1);
    return true;
  }
  bool I64(int64_t* v) {
    if (in_.size() < 8) return false;
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= uint64_t{static_cast<uint8_t>(in_[i])} << (8 * i);
    *v = static_cast<int64_t>(u);
    in_.remove_prefix(8);
    return true;
  }
  // A length-prefixed string of at most `max` bytes.
  bool Str(std::string* s, size_t max) {
    if (in_.size() < 4) return false;
    uint32_t n = 0;
    for (int i = 0; i < 4; ++i) n |= uint32_t{static_cast<uint8_t>(in_[i])} << (8 * i);
    if (n > max || in_.size() - 4 < n) return false;
    s->assign(in_.data() + 4, n);
    in_.remove_prefix(4 + size_t{n});
    return true;
  }
  bool Raw(std::string* s, size_t n) {
    if (in_.size() < n) return false;
    s->assign(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  bool done() const { return in_.empty(); }
  size_t left() const { return in_.size(); }

 private:
  absl::string_view in_;
};

absl::Status Malformed(StoreOp op, absl::string_view what, size_t payload_bytes) {
  return absl::InvalidArgumentError(
      absl::StrCat("malformed ", StoreOpName(op), " request (", payload_bytes, " bytes): ", what));
}

std::string Proof(absl::string_view label, absl::string_view secret, absl::string_view server_nonce,
                  absl::string_view client_nonce) {
  return HmacSha256(secret, absl::StrCat(label, server_nonce, client_nonce));
}

}  // namespace

absl::StatusOr<size_t> FrameAssembler::Consume(absl::string_view data) {
  size_t used = 0;
  if (header_len_ < 4) {
    const size_t take = std::min(data.size(), 4 - header_len_);
    for (size_t i = 0; i < take; ++i)
      header_[header_len_ + i] = static_cast<unsigned char>(data[i]);
    header_len_ += take;
    used += take;
    data.remove_prefix(take);
    if (header_len_ < 4) return used;
    body_len_ = size_t{header_[0]} | (size_t{header_[1]} << 8) | (size_t{header_[2]} << 16) |
                (size_t{header_[3]} << 24);
    if (body_len_ > max_frame_bytes_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "message of ", body_len_, " bytes exceeds the limit of ", max_frame_bytes_, " bytes"));
    }
  }
  const size_t take = std::min(data.size(), body_len_ - body_.size());
  if (take > 0) {
    const size_t need = body_.size() + take;
    if (need > body_.capacity()) {
      // Grow with what has arrived (at most doubling), never past the announced length.
      body_.reserve(std::min(body_len_, std::max(need, 2 * body_.size())));
    }
    body_.append(data.data(), take);
    used += take;
  }
  return used;
}

size_t FrameAssembler::BytesWanted() const {
  if (header_len_ < 4) return 4 - header_len_;
  return body_len_ - body_.size();
}

std::string FrameAssembler::TakeFrame() {
  std::string frame = std::move(body_);
  body_ = std::string();
  header_len_ = 0;
  body_len_ = 0;
  return frame;
}

std::string EncodeFrame(absl::string_view payload) {
  const uint32_t n = static_cast<uint32_t>(payload.size());
  std::string out;
  out.reserve(4 + payload.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out.append(payload.data(), payload.size());
  return out;
}

std::string EncodeHello(const Hello& hello) {
  std::string nonce = hello.nonce;
  nonce.resize(kStoreNonceBytes, '\0');
  return Writer()
      .Raw(kMagic)
      .U8(kVersion)
      .U8(hello.auth_required ? kFlagAuth : 0)
      .Raw(nonce)
      .Take();
}

absl::StatusOr<Hello> ParseHello(absl::string_view payload) {
  Reader r(payload);
  std::string magic, nonce;
  uint8_t version = 0, flags = 0;
  if (!r.Raw(&magic, kMagic.size()) || magic != kMagic) {
    return absl::InvalidArgumentError(
        "the greeting does not come from a TcpStore server (another program on this port?)");
  }
  if (!r.U8(&version) || version != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat("the TcpStore server speaks protocol version ",
                                                   version, "; this client speaks ", kVersion));
  }
  if (!r.U8(&flags) || !r.Raw(&nonce, kStoreNonceBytes) || !r.done()) {
    return absl::InvalidArgumentError("malformed greeting from the TcpStore server");
  }
  Hello hello;
  hello.auth_required = (flags & kFlagAuth) != 0;
  hello.nonce = std::move(nonce);
  return hello;
}

std::string EncodeAuthProof(const AuthProof& proof) {
  return Writer().Raw(proof.client_nonce).Raw(proof.mac).Take();
}

absl::StatusOr<AuthProof> ParseAuthProof(absl::string_view payload) {
  AuthProof proof;
  Reader r(payload);
  if (!r.Raw(&proof.client_nonce, kStoreNonceBytes) || !r.Raw(&proof.mac, kSha256Bytes) ||
      !r.done()) {
    return absl::InvalidArgumentError(absl::StrCat("malformed authentication message (",
                                                   payload.size(), " bytes, expected ",
                                                   kStoreNonceBytes + kSha256Bytes, ")"));
  }
  return proof;
}

std::string ClientProof(absl::string_view secret, absl::string_view server_nonce,
                        absl::string_view client_nonce) {
  return Proof(kClientLabel, secret, server_nonce, client_nonce);
}

std::string ServerProof(absl::string_view secret, absl::string_view server_nonce,
                        absl::string_view client_nonce) {
  return Proof(kServerLabel, secret, server_nonce, client_nonce);
}

std::string StoreOpName(StoreOp op) {
  switch (op) {
    case StoreOp::kSet:
      return "Set";
    case StoreOp::kGet:
      return "Get";
    case StoreOp::kAdd:
      return "Add";
    case StoreOp::kWait:
      return "Wait";
    case StoreOp::kCheck:
      return "Check";
    case StoreOp::kDelete:
      return "DeleteKey";
  }
  return absl::StrCat("op ", static_cast<int>(op));
}

std::string EncodeRequest(const Request& request) {
  Writer w;
  w.U8(static_cast<uint8_t>(request.op));
  switch (request.op) {
    case StoreOp::kSet:
      w.Str(request.key).Str(request.value);
      break;
    case StoreOp::kGet:
      w.Str(request.key).I64(request.timeout_ms);
      break;
    case StoreOp::kAdd:
      w.Str(request.key).I64(request.delta);
      break;
    case StoreOp::kWait:
    case StoreOp::kCheck:
      w.I64(static_cast<int64_t>(request.keys.size()));
      for (const std::string& k : request.keys) w.Str(k);
      if (request.op == StoreOp::kWait) w.I64(request.timeout_ms);
      break;
    case StoreOp::kDelete:
      w.Str(request.key);
      break;
  }
  return w.Take();
}

absl::StatusOr<Request> ParseRequest(absl::string_view payload) {
  Reader r(payload);
  uint8_t op = 0;
  if (!r.U8(&op)) return absl::InvalidArgumentError("empty request");
  Request req;
  req.op = static_cast<StoreOp>(op);
  const size_t n = payload.size();
  constexpr size_t kMaxKey = static_cast<size_t>(kStoreMaxKeyBytes);
  switch (req.op) {
    case StoreOp::kSet:
      if (!r.Str(&req.key, kMaxKey)) return Malformed(req.op, "bad key", n);
      if (!r.Str(&req.value, payload.size())) return Malformed(req.op, "bad value", n);
      break;
    case StoreOp::kGet:
      if (!r.Str(&req.key, kMaxKey)) return Malformed(req.op, "bad key", n);
      if (!r.I64(&req.timeout_ms)) return Malformed(req.op, "no timeout", n);
      break;
    case StoreOp::kAdd:
      if (!r.Str(&req.key, kMaxKey)) return Malformed(req.op, "bad key", n);
      if (!r.I64(&req.delta)) return Malformed(req.op, "no delta", n);
      break;
    case StoreOp::kWait:
    case StoreOp::kCheck: {
      int64_t count = 0;
      if (!r.I64(&count)) return Malformed(req.op, "no key count", n);
      if (count < 0 || count > kStoreMaxKeysPerRequest) {
        return Malformed(
            req.op,
            absl::StrCat("key count ", count, " is outside [0, ", kStoreMaxKeysPerRequest, "]"), n);
      }
      // Each key takes at least its 4-byte length, so a count the payload cannot hold is
      // refused before anything is allocated for it.
      if (static_cast<uint64_t>(count) > r.left() / 4) {
        return Malformed(req.op, absl::StrCat("key count ", count, " exceeds the payload"), n);
      }
      req.keys.resize(static_cast<size_t>(count));
      for (std::string& k : req.keys) {
        if (!r.Str(&k, kMaxKey)) return Malformed(req.op, "bad key", n);
      }
      if (req.op == StoreOp::kWait && !r.I64(&req.timeout_ms)) {
        return Malformed(req.op, "no timeout", n);
      }
      break;
    }
    case StoreOp::kDelete:
      if (!r.Str(&req.key, kMaxKey)) return Malformed(req.op, "bad key", n);
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown request op ", static_cast<int>(op), " (", n, " bytes)"));
  }
  if (!r.done()) return Malformed(req.op, absl::StrCat(r.left(), " trailing bytes"), n);
  return req;
}

std::string EncodeReply(const absl::Status& status, absl::string_view body) {
  return Writer()
      .U8(static_cast<uint8_t>(status.code()))
      .Str(status.ok() ? body : absl::string_view(status.message()))
      .Take();
}

absl::StatusOr<Reply> ParseReply(absl::string_view payload) {
  Reader r(payload);
  uint8_t code = 0;
  std::string text;
  if (!r.U8(&code) || !r.Str(&text, payload.size()) || !r.done()) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed reply from the TcpStore server (", payload.size(), " bytes)"));
  }
  Reply reply;
  if (code == 0) {
    reply.body = std::move(text);
    return reply;
  }
  // Codes 1..16 are the canonical ones; anything else from the wire reads as kUnknown.
  const absl::StatusCode status_code =
      code <= static_cast<uint8_t>(absl::StatusCode::kUnauthenticated)
          ? static_cast<absl::StatusCode>(code)
          : absl::StatusCode::kUnknown;
  reply.status = absl::Status(status_code, text);
  return reply;
}

std::string EncodeI64(int64_t v) { return Writer().I64(v).Take(); }

absl::StatusOr<int64_t> ParseI64(absl::string_view body) {
  Reader r(body);
  int64_t v = 0;
  if (!r.I64(&v) || !r.done()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected an 8-byte integer, got ", body.size(), " bytes"));
  }
  return v;
}

std::string EncodeBool(bool v) { return Writer().U8(v ? 1 : 0).Take(); }

absl::StatusOr<bool> ParseBool(absl::string_view body) {
  Reader r(body);
  uint8_t v = 0;
  if (!r.U8(&v) || !r.done() || v > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a 1-byte boolean, got ", body.size(), " bytes"));
  }
  return v != 0;
}

}  // namespace internal
}  // namespace comm
