#include "comm/tcp_store.h"

#include <dirent.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "comm/internal/raw_store_client.h"
#include "comm/internal/socket.h"
#include "comm/internal/store_protocol.h"
#include "comm/testing/store_conformance.h"
#include "gtest/gtest.h"

namespace comm {
namespace {

using ::comm::internal::RawStoreClient;
using ::comm::internal::Reply;
using ::comm::internal::Request;
using ::comm::internal::StoreOp;
using ::comm::testing::StoreConformanceTest;

constexpr char kSecret[] = "test job secret";

// A server store on a kernel-chosen port; the fixture's store object is the server.
std::shared_ptr<Store> MakeServer() {
  TcpStoreOptions opts;
  opts.is_server = true;
  return TcpStore::Create(opts).value();
}

std::shared_ptr<Store> ConnectClient(const std::shared_ptr<Store>& server) {
  TcpStoreOptions opts;
  opts.port = std::static_pointer_cast<TcpStore>(server)->port();
  opts.connect_timeout = absl::Seconds(10);
  return TcpStore::Create(opts).value();
}

std::shared_ptr<Store> MakeServerWithSecret() {
  TcpStoreOptions opts;
  opts.is_server = true;
  opts.secret = kSecret;
  return TcpStore::Create(opts).value();
}

std::shared_ptr<Store> ConnectClientWithSecret(const std::shared_ptr<Store>& server) {
  TcpStoreOptions opts;
  opts.port = std::static_pointer_cast<TcpStore>(server)->port();
  opts.connect_timeout = absl::Seconds(10);
  opts.secret = kSecret;
  return TcpStore::Create(opts).value();
}

INSTANTIATE_TEST_SUITE_P(
    TcpStore, StoreConformanceTest,
    ::testing::Values(testing::StoreFactory{"TcpStore", MakeServer, ConnectClient},
                      testing::StoreFactory{"TcpStoreWithSecret", MakeServerWithSecret,
                                            ConnectClientWithSecret}),
    testing::StoreFactoryName);

// Threads of this process, from /proc/self/task.
int ThreadCount() {
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(dir);
  return n;
}

std::shared_ptr<TcpStore> Server(TcpStoreOptions opts) {
  opts.is_server = true;
  return TcpStore::Create(opts).value();
}

absl::StatusOr<std::shared_ptr<TcpStore>> Client(int port, const std::string& secret,
                                                 absl::Duration timeout = absl::Seconds(10)) {
  TcpStoreOptions opts;
  opts.port = port;
  opts.secret = secret;
  opts.connect_timeout = timeout;
  return TcpStore::Create(opts);
}

TEST(TcpStoreTest, ClientStartedBeforeTheServerRetriesUntilItIsUp) {
  const int port = internal::PickFreePort().value();
  absl::StatusOr<std::shared_ptr<TcpStore>> client;
  std::thread t([&] {
    TcpStoreOptions opts;
    opts.port = port;
    opts.connect_timeout = absl::Seconds(20);
    client = TcpStore::Create(opts);
  });
  absl::SleepFor(absl::Milliseconds(300));
  TcpStoreOptions server_opts;
  server_opts.is_server = true;
  server_opts.port = port;
  auto server = TcpStore::Create(server_opts);
  t.join();
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Set("hello", "world").ok());
  EXPECT_EQ((*server)->Get("hello", absl::Seconds(1)).value(), "world");
}

TEST(TcpStoreTest, ConnectGivesUpAtTheDeadlineNamingTheServer) {
  const int port = internal::PickFreePort().value();
  TcpStoreOptions opts;
  opts.port = port;
  opts.connect_timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  auto client = TcpStore::Create(opts);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kDeadlineExceeded) << client.status();
  EXPECT_NE(client.status().message().find(absl::StrCat("127.0.0.1:", port)), std::string::npos)
      << client.status();
  // 300 ms of retries plus at most one 1 s backoff step and slack for a loaded machine.
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(TcpStoreTest, OversizedValuesAndKeysAreRefused) {
  TcpStoreOptions opts;
  opts.is_server = true;
  opts.max_value_bytes = 1000;
  auto store = TcpStore::Create(opts).value();
  EXPECT_TRUE(store->Set("ok", std::string(1000, 'x')).ok());
  absl::Status big = store->Set("big", std::string(1001, 'x'));
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument) << big;
  EXPECT_NE(big.message().find("max_value_bytes"), std::string::npos) << big;
  EXPECT_EQ(store->Set(std::string(TcpStore::kMaxKeyBytes + 1, 'k'), "v").code(),
            absl::StatusCode::kInvalidArgument);
  // The store still works after refusing.
  EXPECT_EQ(store->Get("ok", absl::Seconds(1)).value().size(), 1000u);
}

TEST(TcpStoreTest, ServerRefusesAnOversizedFrameFromARawClient) {
  TcpStoreOptions opts;
  opts.is_server = true;
  opts.max_value_bytes = 1000;
  auto store = TcpStore::Create(opts).value();
  RawStoreClient raw = RawStoreClient::Connect(store->port()).value();
  EXPECT_FALSE(raw.hello().auth_required);
  // A header announcing 1 GiB: the server must answer with an error and hang up rather
  // than try to buffer it.
  const char header[4] = {0, 0, 0, 0x40};
  ASSERT_TRUE(raw.SendRaw(absl::string_view(header, 4)).ok());
  absl::StatusOr<Reply> reply = raw.Receive(absl::Seconds(10));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status.code(), absl::StatusCode::kInvalidArgument) << reply->status;
  EXPECT_NE(reply->status.message().find("exceeds the limit"), std::string::npos) << reply->status;
  EXPECT_NE(reply->status.message().find("max_value_bytes"), std::string::npos) << reply->status;
  EXPECT_TRUE(raw.ClosedByServerWithin(absl::Seconds(10)));
  EXPECT_TRUE(store->Set("still", "serving").ok());
}

TEST(TcpStoreTest, ServerBindsToLoopbackByDefault) {
  TcpStoreOptions opts;
  opts.is_server = true;
  auto store = TcpStore::Create(opts).value();
  // /proc/net/tcp lists listening sockets (state 0A) as hex "ADDR:PORT"; 0100007F is
  // 127.0.0.1 in the kernel's byte order.
  std::ifstream tcp("/proc/net/tcp");
  ASSERT_TRUE(tcp.good());
  const std::string port_hex = absl::StrFormat(":%04X", store->port());
  std::string line, local;
  bool found = false;
  while (std::getline(tcp, line)) {
    std::istringstream fields(line);
    std::string sl, local_addr, remote, state;
    fields >> sl >> local_addr >> remote >> state;
    if (state == "0A" && local_addr.size() > 5 &&
        local_addr.substr(local_addr.size() - 5) == port_hex) {
      found = true;
      local = local_addr;
    }
  }
  ASSERT_TRUE(found) << "no listening socket on port " << store->port();
  EXPECT_EQ(local.substr(0, 8), "0100007F") << local;
}

TEST(TcpStoreTest, ClientsFailInsteadOfHangingWhenTheServerGoesAway) {
  TcpStoreOptions opts;
  opts.is_server = true;
  auto server = TcpStore::Create(opts).value();
  TcpStoreOptions client_opts;
  client_opts.port = server->port();
  client_opts.connect_timeout = absl::Milliseconds(500);
  auto client = TcpStore::Create(client_opts).value();
  absl::StatusOr<std::string> pending;
  std::thread waiter([&] { pending = client->Get("never", absl::Seconds(30)); });
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time start = absl::Now();
  server.reset();
  waiter.join();
  EXPECT_FALSE(pending.ok());
  // The server's shutdown wakes the blocked request at once; 5 s is slack for load.
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  absl::Status after = client->Set("k", "v");
  EXPECT_FALSE(after.ok());
  EXPECT_NE(after.message().find("127.0.0.1"), std::string::npos) << after;
}

TEST(TcpStoreTest, ClientNeedsAPort) {
  TcpStoreOptions opts;
  EXPECT_EQ(TcpStore::Create(opts).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TcpStoreAuthTest, RightSecretWorksBothWays) {
  TcpStoreOptions opts;
  opts.secret = kSecret;
  auto server = Server(opts);
  auto client = Client(server->port(), kSecret);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Set("k", "v").ok());
  EXPECT_EQ(server->Get("k", absl::Seconds(1)).value(), "v");
}

TEST(TcpStoreAuthTest, MissingOrWrongSecretIsPermissionDeniedAndSetsNothing) {
  TcpStoreOptions opts;
  opts.secret = kSecret;
  auto server = Server(opts);
  const std::string where = absl::StrCat("TcpStore 127.0.0.1:", server->port());
  for (const std::string& secret : {std::string(), std::string("wrong secret")}) {
    const absl::Time start = absl::Now();
    auto client = Client(server->port(), secret, absl::Seconds(20));
    EXPECT_EQ(client.status().code(), absl::StatusCode::kPermissionDenied) << client.status();
    const std::string message(client.status().message());
    EXPECT_NE(message.find(where + ": authentication failed: the job secret (FSDP_JOB_SECRET) "
                                   "does not match"),
              std::string::npos)
        << message;
    // Refused at once, not after retrying until connect_timeout.
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "secret \"" << secret << "\"";
  }
  // A client that skips the handshake and sends a Set: its frame is taken as a (wrong)
  // proof, refused, and the connection closed; the key never appears.
  RawStoreClient raw = RawStoreClient::Connect(server->port()).value();
  EXPECT_TRUE(raw.hello().auth_required);
  Request set;
  set.op = StoreOp::kSet;
  set.key = "world/1";
  set.value = "stolen";
  ASSERT_TRUE(raw.Send(set).ok());
  absl::StatusOr<Reply> reply = raw.Receive(absl::Seconds(10));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status.code(), absl::StatusCode::kPermissionDenied) << reply->status;
  EXPECT_TRUE(raw.ClosedByServerWithin(absl::Seconds(10)));
  // A raw client with the wrong secret gets the same.
  RawStoreClient wrong = RawStoreClient::Connect(server->port()).value();
  EXPECT_EQ(wrong.Authenticate("guess").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(wrong.ClosedByServerWithin(absl::Seconds(10)));

  auto good = Client(server->port(), kSecret).value();
  EXPECT_FALSE(good->Check({"world/1"}).value()) << "an unauthenticated Set got through";
  EXPECT_TRUE(good->Set("world/1", "real").ok());
  EXPECT_EQ(server->Get("world/1", absl::Seconds(1)).value(), "real");
}

TEST(TcpStoreAuthTest, ClientWithASecretRefusesAServerThatAsksForNone) {
  auto server = Server(TcpStoreOptions{});
  auto client = Client(server->port(), kSecret);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kPermissionDenied) << client.status();
  EXPECT_NE(client.status().message().find("FSDP_JOB_SECRET"), std::string::npos)
      << client.status();
}

TEST(TcpStoreAuthTest, RandomBytesFromUnauthenticatedClientsNeverHurtTheServer) {
  TcpStoreOptions opts;
  opts.secret = kSecret;
  opts.partial_message_timeout = absl::Milliseconds(500);
  auto server = Server(opts);
  auto good = Client(server->port(), kSecret).value();
  std::mt19937 rng(1234);
  for (int round = 0; round < 50; ++round) {
    RawStoreClient raw =
        RawStoreClient::Connect(server->port(), /*read_greeting=*/round % 2).value();
    std::string junk(1 + rng() % 400, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    (void)raw.SendRaw(junk);  // the server may hang up before all of it is sent
    // Whatever the bytes announce, the server closes the connection: at once (a refused
    // proof or size) or at the handshake deadline.
    EXPECT_TRUE(raw.ClosedByServerWithin(absl::Seconds(10))) << "round " << round;
    ASSERT_TRUE(good->Set(absl::StrCat("k", round), "v").ok()) << "round " << round;
  }
  EXPECT_FALSE(good->Check({"world/1"}).value());
  EXPECT_EQ(good->Add("rounds", 50).value(), 50);
}

TEST(TcpStoreTest, RandomRequestsAfterTheHandshakeGetErrorsNotACrash) {
  auto server = Server(TcpStoreOptions{});
  std::mt19937 rng(99);
  for (int round = 0; round < 50; ++round) {
    RawStoreClient raw = RawStoreClient::Connect(server->port()).value();
    std::string junk(1 + rng() % 300, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    junk[0] = static_cast<char>(1 + rng() % 7);  // mostly known ops with garbage fields
    ASSERT_TRUE(raw.SendRaw(internal::EncodeFrame(junk)).ok());
    absl::StatusOr<Reply> reply = raw.Receive(absl::Seconds(10));
    // Garbage rarely parses; when it does it is a valid request and gets an answer.
    if (reply.ok() && !reply->status.ok()) {
      EXPECT_EQ(reply->status.code(), absl::StatusCode::kInvalidArgument) << reply->status;
      EXPECT_NE(reply->status.message().find("TcpStore server 127.0.0.1:"), std::string::npos)
          << reply->status;
    }
  }
  EXPECT_TRUE(server->Set("alive", "yes").ok());
}

TEST(TcpStoreTest, AddOverflowIsInvalidArgumentNamingKeyValueAndDelta) {
  auto server = Server(TcpStoreOptions{});
  auto client = Client(server->port(), "").value();
  ASSERT_EQ(client->Add("big", INT64_MAX).value(), INT64_MAX);
  absl::StatusOr<int64_t> over = client->Add("big", 1);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument) << over.status();
  const std::string message(over.status().message());
  EXPECT_NE(message.find("\"big\""), std::string::npos) << message;
  EXPECT_NE(message.find(absl::StrCat(INT64_MAX)), std::string::npos) << message;
  EXPECT_NE(message.find(", 1)"), std::string::npos) << message;
  EXPECT_EQ(client->Add("big", 0).value(), INT64_MAX) << "a refused Add changed the counter";

  ASSERT_EQ(client->Add("small", INT64_MIN).value(), INT64_MIN);
  absl::StatusOr<int64_t> under = client->Add("small", -1);
  EXPECT_EQ(under.status().code(), absl::StatusCode::kInvalidArgument) << under.status();
  EXPECT_NE(under.status().message().find(absl::StrCat(INT64_MIN)), std::string::npos)
      << under.status();
  // From the far ends, a delta of the other sign is fine.
  EXPECT_EQ(client->Add("small", INT64_MAX).value(), -1);
  EXPECT_EQ(client->Add("big", INT64_MIN).value(), -1);
  EXPECT_EQ(client->Add("fresh", INT64_MIN).value(), INT64_MIN);
}

TEST(TcpStoreTest, ConnectionsBeyondTheLimitAreClosedAtOnce) {
  TcpStoreOptions opts;
  opts.max_connections = 4;  // the server's own store is one of them
  auto server = Server(opts);
  std::vector<RawStoreClient> held;
  for (int i = 0; i < 3; ++i) held.push_back(RawStoreClient::Connect(server->port()).value());
  EXPECT_EQ(server->ServerConnectionCount(), 4);
  absl::StatusOr<RawStoreClient> extra = RawStoreClient::Connect(server->port(), false);
  ASSERT_TRUE(extra.ok()) << extra.status();
  EXPECT_TRUE(extra->ClosedByServerWithin(absl::Seconds(5)));
  auto refused = Client(server->port(), "", absl::Milliseconds(300));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDeadlineExceeded) << refused.status();
  EXPECT_TRUE(server->Set("own", "works").ok()) << "the server's own connection was dropped";
  held.pop_back();  // closes one
  auto admitted = Client(server->port(), "", absl::Seconds(10));
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_EQ((*admitted)->Get("own", absl::Seconds(1)).value(), "works");
}

TEST(TcpStoreTest, StalledPartialMessagesAndHandshakesAreDroppedIdleConnectionsKept) {
  TcpStoreOptions opts;
  opts.secret = kSecret;
  opts.partial_message_timeout = absl::Milliseconds(500);
  auto server = Server(opts);
  RawStoreClient stalled = RawStoreClient::Connect(server->port()).value();
  ASSERT_TRUE(stalled.Authenticate(kSecret).ok());
  const char header[4] = {static_cast<char>(0xe8), 0x03, 0, 0};  // 1000 bytes announced
  const absl::Time start = absl::Now();  // the server's clock starts after this
  ASSERT_TRUE(stalled.SendRaw(absl::string_view(header, 4)).ok());
  ASSERT_TRUE(stalled.SendRaw("only ten b").ok());
  RawStoreClient silent = RawStoreClient::Connect(server->port()).value();  // never proves
  RawStoreClient idle = RawStoreClient::Connect(server->port()).value();
  ASSERT_TRUE(idle.Authenticate(kSecret).ok());

  EXPECT_TRUE(stalled.ClosedByServerWithin(absl::Seconds(10)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(450)) << "dropped before the deadline";
  EXPECT_TRUE(silent.ClosedByServerWithin(absl::Seconds(10)));
  // The idle, authenticated connection is still served after the deadline has passed.
  absl::SleepFor(absl::Milliseconds(700));
  Request check;
  check.op = StoreOp::kCheck;
  ASSERT_TRUE(idle.Send(check).ok());
  absl::StatusOr<Reply> reply = idle.Receive(absl::Seconds(10));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->status.ok()) << reply->status;
}

TEST(TcpStoreTest, PartialMessagesBeyondTheMemoryBudgetAreRefused) {
  TcpStoreOptions opts;
  opts.max_value_bytes = 100000;
  opts.max_buffered_bytes = 50000;
  auto server = Server(opts);
  RawStoreClient big = RawStoreClient::Connect(server->port()).value();
  const char header[4] = {static_cast<char>(0xa0), static_cast<char>(0x86), 0x01, 0};  // 100000
  ASSERT_TRUE(big.SendRaw(absl::string_view(header, 4)).ok());
  (void)big.SendRaw(std::string(60000, 'x'));  // the server may hang up mid-way
  absl::StatusOr<Reply> reply = big.Receive(absl::Seconds(10));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status.code(), absl::StatusCode::kResourceExhausted) << reply->status;
  EXPECT_NE(reply->status.message().find("max_buffered_bytes"), std::string::npos) << reply->status;
  EXPECT_TRUE(big.ClosedByServerWithin(absl::Seconds(10)));
  // A message under the budget still goes through, and the budget was given back.
  EXPECT_TRUE(server->Set("fits", std::string(40000, 'y')).ok());
  EXPECT_TRUE(server->Set("fits again", std::string(40000, 'z')).ok());
}

TEST(TcpStoreTest, BlockedGetsWaitWithoutAThreadEachAndAllWakeOnSet) {
  TcpStoreOptions opts;
  opts.secret = kSecret;
  auto server = Server(opts);
  const int threads_before = ThreadCount();
  constexpr int kWaiters = 200;
  std::vector<RawStoreClient> waiters;
  Request get;
  get.op = StoreOp::kGet;
  get.key = "late";
  get.timeout_ms = 30000;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.push_back(RawStoreClient::Connect(server->port()).value());
    ASSERT_TRUE(waiters.back().Authenticate(kSecret).ok());
    ASSERT_TRUE(waiters.back().Send(get).ok());
  }
  // One short Wait among them times out on its own while the Gets keep waiting.
  RawStoreClient short_wait = RawStoreClient::Connect(server->port()).value();
  ASSERT_TRUE(short_wait.Authenticate(kSecret).ok());
  Request wait;
  wait.op = StoreOp::kWait;
  wait.keys = {"late", "never"};
  wait.timeout_ms = 200;
  ASSERT_TRUE(short_wait.Send(wait).ok());
  absl::StatusOr<Reply> timed_out = short_wait.Receive(absl::Seconds(10));
  ASSERT_TRUE(timed_out.ok()) << timed_out.status();
  EXPECT_EQ(timed_out->status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(timed_out->status.message().find("never"), std::string::npos) << timed_out->status;

  const int threads_waiting = ThreadCount();
  std::printf("threads: %d before %d blocked Gets, %d while they wait\n", threads_before, kWaiters,
              threads_waiting);
  EXPECT_EQ(threads_waiting, threads_before) << "the server started threads for waiters";
  ASSERT_TRUE(server->Set("late", "finally").ok());
  for (int i = 0; i < kWaiters; ++i) {
    absl::StatusOr<Reply> reply = waiters[i].Receive(absl::Seconds(10));
    ASSERT_TRUE(reply.ok()) << "waiter " << i << ": " << reply.status();
    ASSERT_TRUE(reply->status.ok()) << "waiter " << i << ": " << reply->status;
    EXPECT_EQ(reply->body, "finally");
  }
}

TEST(TcpStoreTest, OptionsOutOfRangeAreInvalidArgumentNamingThem) {
  TcpStoreOptions opts;
  opts.is_server = true;
  opts.max_connections = 0;
  auto s = TcpStore::Create(opts);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("max_connections"), std::string::npos) << s.status();
  opts.max_connections = 8;
  opts.partial_message_timeout = absl::ZeroDuration();
  s = TcpStore::Create(opts);
  EXPECT_NE(s.status().message().find("partial_message_timeout"), std::string::npos) << s.status();
}

}  // namespace
}  // namespace comm
