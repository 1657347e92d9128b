// Stress tests for the TcpStore server's bounds (NOTE [TcpStore server bounds] in
// comm/internal/tcp_store_server.h): connection churn, and many stalled connections that
// announce huge messages, while a real client keeps working. Each prints its figures
// (threads, resident memory) to the test log.
#include <dirent.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "comm/internal/raw_store_client.h"
#include "comm/tcp_store.h"
#include "gtest/gtest.h"

namespace comm {
namespace {

using ::comm::internal::RawStoreClient;

constexpr char kSecret[] = "stress secret";

#if defined(__SANITIZE_ADDRESS__)
// AddressSanitizer keeps freed memory in quarantine (256 MiB by default) and adds
// shadow memory, so resident memory grows with churn regardless of leaks.
constexpr int64_t kChurnRssBoundKb = 600 << 10;
#else
constexpr int64_t kChurnRssBoundKb = 64 << 10;
#endif

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

// Resident memory of this process in KiB (VmRSS in /proc/self/status).
int64_t RssKb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

std::shared_ptr<TcpStore> Server(TcpStoreOptions opts) {
  opts.is_server = true;
  opts.secret = kSecret;
  return TcpStore::Create(opts).value();
}

std::shared_ptr<TcpStore> Client(int port) {
  TcpStoreOptions opts;
  opts.port = port;
  opts.secret = kSecret;
  opts.connect_timeout = absl::Seconds(10);
  return TcpStore::Create(opts).value();
}

// Waits until the server has exactly `n` connections open; false after `timeout`.
bool ConnectionsSettleAt(const TcpStore& server, int n, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (server.ServerConnectionCount() != n) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

// A real client doing Set, Get and Add in a loop and checking every answer.
class CheckingClient {
 public:
  explicit CheckingClient(int port) : store_(Client(port)) {
    thread_ = std::thread([this] { Run(); });
  }
  // Stops the loop; returns the first wrong answer or error (OK if none).
  absl::Status Finish() {
    stop_.store(true);
    thread_.join();
    absl::MutexLock lock(&mu_);
    return first_error_;
  }
  int64_t rounds() const { return rounds_.load(); }

 private:
  void Run() {
    for (int64_t i = 0; !stop_.load(); ++i) {
      const std::string key = absl::StrCat("key/", i % 100);
      const std::string value = absl::StrCat("value ", i);
      absl::Status s = store_->Set(key, value);
      absl::StatusOr<std::string> got =
          s.ok() ? store_->Get(key, absl::Seconds(10)) : absl::StatusOr<std::string>(s);
      absl::StatusOr<int64_t> count =
          got.ok() ? store_->Add("count", 1) : absl::StatusOr<int64_t>(got.status());
      absl::Status verdict = count.status();
      if (verdict.ok() && *got != value) {
        verdict = absl::InternalError(absl::StrCat("Get(", key, ") = ", *got, ", want ", value));
      } else if (verdict.ok() && *count != i + 1) {
        verdict = absl::InternalError(absl::StrCat("Add = ", *count, ", want ", i + 1));
      }
      if (!verdict.ok()) {
        absl::MutexLock lock(&mu_);
        first_error_ =
            absl::Status(verdict.code(), absl::StrCat("round ", i, ": ", verdict.message()));
        return;
      }
      rounds_.store(i + 1);
    }
  }

  std::shared_ptr<TcpStore> store_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> rounds_{0};
  absl::Mutex mu_;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

TEST(TcpStoreStressTest, HundredThousandConnectCloseCyclesKeepThreadsAndMemoryBounded) {
  auto server = Server(TcpStoreOptions{});
  const int threads_before = ThreadCount();  // this thread and the server's loop
  const int64_t rss_before = RssKb();
  CheckingClient client(server->port());
  constexpr int kCycles = 100000;
  int max_threads = ThreadCount(), max_connections = 0;
  const absl::Time start = absl::Now();
  for (int i = 0; i < kCycles; ++i) {
    // Most connections are dropped with a reset before the greeting is even read (no
    // TIME_WAIT left behind, so the ports last); every 16th reads it and closes politely.
    const bool polite = i % 16 == 0;
    absl::StatusOr<RawStoreClient> raw = RawStoreClient::Connect(server->port(), polite);
    ASSERT_TRUE(raw.ok()) << "cycle " << i << ": " << raw.status();
    if (!polite) raw->CloseWithReset();
    if (i % 5000 == 0) {
      max_threads = std::max(max_threads, ThreadCount());
      max_connections = std::max(max_connections, server->ServerConnectionCount());
    }
  }
  const absl::Duration took = absl::Now() - start;
  // The server's own store and the checking client remain.
  EXPECT_TRUE(ConnectionsSettleAt(*server, 2, absl::Seconds(10)))
      << server->ServerConnectionCount() << " connections still open";
  const int threads_after = ThreadCount();
  const int64_t rss_after = RssKb();
  const int64_t rounds = client.rounds();
  absl::Status answers = client.Finish();
  std::printf(
      "%d connect/close cycles in %s; threads: %d before (test + server loop), max %d during "
      "(+1 checking client), %d after; server connections: max %d sampled; RSS: %lld KiB "
      "before, %lld KiB after (bound: growth < %lld KiB); checking client: %lld Set/Get/Add "
      "rounds\n",
      kCycles, absl::FormatDuration(took).c_str(), threads_before, max_threads, threads_after,
      max_connections, static_cast<long long>(rss_before), static_cast<long long>(rss_after),
      static_cast<long long>(kChurnRssBoundKb), static_cast<long long>(rounds));
  EXPECT_TRUE(answers.ok()) << answers;
  EXPECT_GT(rounds, 0);
  EXPECT_LE(max_threads, threads_before + 1) << "the server started threads per connection";
  EXPECT_LE(threads_after, threads_before + 1);
  EXPECT_LT(rss_after - rss_before, kChurnRssBoundKb);
}

TEST(TcpStoreStressTest, StalledConnectionsAnnouncingHugeMessagesCostNoMemoryAndAreDropped) {
  TcpStoreOptions opts;
  opts.partial_message_timeout = absl::Seconds(1);
  auto server = Server(opts);
  auto client = Client(server->port());
  constexpr int kStalled = 200;
  // Exactly max_value_bytes (64 MiB), so the size check passes and only the deadline
  // and the growth-as-bytes-arrive rule stand between these and 12.5 GiB of buffers.
  const uint32_t announced = 64u << 20;
  const char header[4] = {static_cast<char>(announced), static_cast<char>(announced >> 8),
                          static_cast<char>(announced >> 16), static_cast<char>(announced >> 24)};
  const int64_t rss_before = RssKb();
  std::vector<RawStoreClient> stalled;
  const absl::Time first_announced = absl::Now();
  for (int i = 0; i < kStalled; ++i) {
    stalled.push_back(RawStoreClient::Connect(server->port()).value());
    ASSERT_TRUE(stalled.back().Authenticate(kSecret).ok()) << i;
    ASSERT_TRUE(stalled.back().SendRaw(absl::string_view(header, 4)).ok()) << i;
    ASSERT_TRUE(stalled.back().SendRaw("0123456789").ok()) << i;
  }
  const absl::Duration announcing = absl::Now() - first_announced;
  // Meanwhile a normal client is served.
  ASSERT_TRUE(client->Set("during", "stall").ok());
  EXPECT_EQ(client->Get("during", absl::Seconds(5)).value(), "stall");
  const int open_during = server->ServerConnectionCount();
  const int64_t rss_during = RssKb();
  constexpr int64_t kBoundKb = 32 << 10;
  std::printf(
      "%d connections announced %u bytes each in %s; server connections open: %d; "
      "RSS: %lld KiB before, %lld KiB while they stall (bound: growth < %lld KiB)\n",
      kStalled, announced, absl::FormatDuration(announcing).c_str(), open_during,
      static_cast<long long>(rss_before), static_cast<long long>(rss_during),
      static_cast<long long>(kBoundKb));
  EXPECT_LT(rss_during - rss_before, kBoundKb);

  int dropped = 0;
  for (RawStoreClient& raw : stalled) dropped += raw.ClosedByServerWithin(absl::Seconds(10));
  const absl::Duration all_dropped = absl::Now() - first_announced;
  std::printf(
      "%d of %d stalled connections dropped by %s after the first announcement "
      "(partial_message_timeout 1s)\n",
      dropped, kStalled, absl::FormatDuration(all_dropped).c_str());
  EXPECT_EQ(dropped, kStalled);
  EXPECT_GE(all_dropped, absl::Milliseconds(950)) << "dropped before the deadline";
  EXPECT_TRUE(ConnectionsSettleAt(*server, 2, absl::Seconds(10)))
      << server->ServerConnectionCount() << " connections still open";
  // The normal client, idle all this time, was not dropped.
  ASSERT_TRUE(client->Set("after", "drop").ok());
  EXPECT_EQ(server->Get("after", absl::Seconds(5)).value(), "drop");
}

}  // namespace
}  // namespace comm
