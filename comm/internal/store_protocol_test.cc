#include "comm/internal/store_protocol.h"

#include <string>
#include <vector>

#include "comm/internal/sha256.h"
#include "gtest/gtest.h"

namespace comm {
namespace internal {
namespace {

std::vector<Request> SampleRequests() {
  std::vector<Request> out;
  Request set;
  set.op = StoreOp::kSet;
  set.key = "world/0";
  set.value = std::string("bin\0ary", 7);
  out.push_back(set);
  Request get;
  get.op = StoreOp::kGet;
  get.key = "k";
  get.timeout_ms = 1500;
  out.push_back(get);
  Request add;
  add.op = StoreOp::kAdd;
  add.key = "counter";
  add.delta = INT64_MIN;
  out.push_back(add);
  Request wait;
  wait.op = StoreOp::kWait;
  wait.keys = {"a", "", "c"};
  wait.timeout_ms = -1;
  out.push_back(wait);
  Request check;
  check.op = StoreOp::kCheck;
  out.push_back(check);
  Request del;
  del.op = StoreOp::kDelete;
  del.key = "gone";
  out.push_back(del);
  return out;
}

TEST(StoreProtocolTest, RequestsRoundTrip) {
  for (const Request& r : SampleRequests()) {
    absl::StatusOr<Request> back = ParseRequest(EncodeRequest(r));
    ASSERT_TRUE(back.ok()) << StoreOpName(r.op) << ": " << back.status();
    EXPECT_EQ(back->op, r.op);
    EXPECT_EQ(back->key, r.key);
    EXPECT_EQ(back->value, r.value);
    EXPECT_EQ(back->delta, r.delta);
    EXPECT_EQ(back->timeout_ms, r.timeout_ms);
    EXPECT_EQ(back->keys, r.keys);
  }
}

TEST(StoreProtocolTest, EveryTruncationAndTrailingByteIsInvalidArgumentNamingTheOp) {
  for (const Request& r : SampleRequests()) {
    const std::string bytes = EncodeRequest(r);
    for (size_t n = 0; n < bytes.size(); ++n) {
      absl::StatusOr<Request> cut = ParseRequest(bytes.substr(0, n));
      EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument)
          << StoreOpName(r.op) << " cut to " << n;
      if (n > 0) {
        EXPECT_NE(cut.status().message().find(StoreOpName(r.op)), std::string::npos)
            << cut.status();
      }
    }
    absl::StatusOr<Request> extra = ParseRequest(bytes + "x");
    EXPECT_EQ(extra.status().code(), absl::StatusCode::kInvalidArgument) << StoreOpName(r.op);
    EXPECT_NE(extra.status().message().find("trailing"), std::string::npos) << extra.status();
  }
}

TEST(StoreProtocolTest, UnknownOpsLongKeysAndHugeKeyCountsAreRefused) {
  EXPECT_EQ(ParseRequest(std::string(1, '\x63')).status().code(),
            absl::StatusCode::kInvalidArgument);
  Request long_key;
  long_key.op = StoreOp::kDelete;
  long_key.key = std::string(kStoreMaxKeyBytes + 1, 'k');
  EXPECT_EQ(ParseRequest(EncodeRequest(long_key)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A Wait announcing 65536 keys in 9 bytes must be refused before anything is sized by
  // the count.
  std::string wait(1, static_cast<char>(StoreOp::kWait));
  const int64_t count = kStoreMaxKeysPerRequest;
  for (int i = 0; i < 8; ++i) wait.push_back(static_cast<char>((count >> (8 * i)) & 0xff));
  absl::StatusOr<Request> parsed = ParseRequest(wait);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("key count"), std::string::npos) << parsed.status();
  std::string negative(1, static_cast<char>(StoreOp::kCheck));
  negative.append(8, '\xff');  // -1
  EXPECT_EQ(ParseRequest(negative).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StoreProtocolTest, RepliesRoundTripAndUnknownCodesReadAsUnknown) {
  absl::StatusOr<Reply> ok = ParseReply(EncodeReply(absl::OkStatus(), "body"));
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ok->status.ok());
  EXPECT_EQ(ok->body, "body");
  absl::StatusOr<Reply> err = ParseReply(EncodeReply(absl::NotFoundError("nope"), "ignored"));
  ASSERT_TRUE(err.ok());
  EXPECT_EQ(err->status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(err->status.message(), "nope");
  std::string odd = EncodeReply(absl::InternalError("x"));
  odd[0] = static_cast<char>(200);
  EXPECT_EQ(ParseReply(odd)->status.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(ParseReply("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseI64(EncodeI64(INT64_MIN)).value(), INT64_MIN);
  EXPECT_FALSE(ParseI64("1234567").ok());
  EXPECT_TRUE(ParseBool(EncodeBool(true)).value());
  EXPECT_FALSE(ParseBool("\x02").ok());
}

TEST(FrameAssemblerTest, CollectsFramesFedAByteAtATime) {
  const std::string stream = EncodeFrame("hello") + EncodeFrame("") + EncodeFrame("world!");
  FrameAssembler in(100);
  std::vector<std::string> frames;
  for (char ch : stream) {
    absl::StatusOr<size_t> used = in.Consume(absl::string_view(&ch, 1));
    ASSERT_TRUE(used.ok()) << used.status();
    ASSERT_EQ(*used, 1u);
    if (in.HasFrame()) frames.push_back(in.TakeFrame());
  }
  EXPECT_EQ(frames, (std::vector<std::string>{"hello", "", "world!"}));
  EXPECT_FALSE(in.InProgress());
}

TEST(FrameAssemblerTest, StopsAtTheEndOfAFrame) {
  const std::string stream = EncodeFrame("abc") + EncodeFrame("de");
  FrameAssembler in(100);
  absl::StatusOr<size_t> used = in.Consume(stream);
  ASSERT_TRUE(used.ok());
  EXPECT_EQ(*used, 7u);
  ASSERT_TRUE(in.HasFrame());
  EXPECT_EQ(in.Consume(absl::string_view(stream).substr(7)).value(), 0u)
      << "consumed past a complete frame";
  EXPECT_EQ(in.TakeFrame(), "abc");
  EXPECT_EQ(in.Consume(absl::string_view(stream).substr(7)).value(), 6u);
  EXPECT_EQ(in.TakeFrame(), "de");
}

TEST(FrameAssemblerTest, RefusesAnOversizedHeaderAndDoesNotAllocateForAnnouncements) {
  FrameAssembler in(1000);
  const unsigned char huge[4] = {0, 0, 0, 0x40};  // 1 GiB
  absl::StatusOr<size_t> used =
      in.Consume(absl::string_view(reinterpret_cast<const char*>(huge), 4));
  EXPECT_EQ(used.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(used.status().message().find("exceeds the limit of 1000 bytes"), std::string::npos)
      << used.status();

  // Within the limit: a 64 MiB announcement with 10 bytes behind it holds ~10 bytes.
  FrameAssembler big(size_t{64} << 20);
  const unsigned char header[4] = {0, 0, 0, 0x04};  // 64 MiB
  ASSERT_TRUE(big.Consume(absl::string_view(reinterpret_cast<const char*>(header), 4)).ok());
  ASSERT_TRUE(big.Consume("0123456789").ok());
  EXPECT_TRUE(big.InProgress());
  EXPECT_EQ(big.AnnouncedBytes(), size_t{64} << 20);
  EXPECT_EQ(big.BodyBytes(), 10u);
  EXPECT_EQ(big.BytesWanted(), (size_t{64} << 20) - 10);
}

TEST(HandshakeTest, HelloAndProofRoundTrip) {
  Hello hello;
  hello.auth_required = true;
  hello.nonce = std::string(kStoreNonceBytes, '\x5a');
  absl::StatusOr<Hello> back = ParseHello(EncodeHello(hello));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->auth_required);
  EXPECT_EQ(back->nonce, hello.nonce);
  EXPECT_EQ(ParseHello("HTTP/1.1 200 OK").status().code(), absl::StatusCode::kInvalidArgument);

  AuthProof proof;
  proof.client_nonce = std::string(kStoreNonceBytes, '\x01');
  proof.mac = ClientProof("secret", hello.nonce, proof.client_nonce);
  absl::StatusOr<AuthProof> p = ParseAuthProof(EncodeAuthProof(proof));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->mac, proof.mac);
  EXPECT_EQ(ParseAuthProof("short").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HandshakeTest, ProofsDependOnSecretNoncesAndDirection) {
  const std::string s(kStoreNonceBytes, 's'), c(kStoreNonceBytes, 'c');
  const std::string base = ClientProof("secret", s, c);
  EXPECT_EQ(base.size(), kSha256Bytes);
  EXPECT_EQ(base, ClientProof("secret", s, c));
  EXPECT_NE(base, ClientProof("secreT", s, c));
  EXPECT_NE(base, ClientProof("secret", c, c));
  EXPECT_NE(base, ClientProof("secret", s, s));
  EXPECT_NE(base, ServerProof("secret", s, c)) << "a client proof must not pass as the server's";
}

}  // namespace
}  // namespace internal
}  // namespace comm
