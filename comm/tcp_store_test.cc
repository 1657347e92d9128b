#include "comm/tcp_store.h"

#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "comm/internal/socket.h"
#include "comm/testing/store_conformance.h"
#include "gtest/gtest.h"

namespace comm {
namespace {

using ::comm::testing::StoreConformanceTest;

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

INSTANTIATE_TEST_SUITE_P(TcpStore, StoreConformanceTest,
                         ::testing::Values(testing::StoreFactory{"TcpStore", MakeServer,
                                                                 ConnectClient}),
                         testing::StoreFactoryName);

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
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  internal::Fd fd = internal::ConnectOnce("127.0.0.1", store->port(), deadline).value();
  // A header announcing 1 GiB: the server must answer with an error and hang up rather
  // than try to buffer it.
  const unsigned char header[4] = {0, 0, 0, 0x40};
  ASSERT_TRUE(internal::SendAll(fd.get(), header, 4, deadline).ok());
  absl::StatusOr<std::string> reply = internal::RecvFrame(fd.get(), 1 << 20, deadline);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(static_cast<uint8_t>((*reply)[0]),
            static_cast<uint8_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(reply->find("exceeds the limit"), std::string::npos);
  char byte;
  EXPECT_EQ(internal::RecvAll(fd.get(), &byte, 1, deadline).code(), absl::StatusCode::kUnavailable);
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

}  // namespace
}  // namespace comm
