// The TcpStore server's event loop (comm/internal/tcp_store_server.h), declared here so
// that its parts can live in separate files; private to the tcp_store_server library:
// - tcp_store_server.cc: Start, the loop itself, accepting, timers, closing;
// - tcp_store_server_io.cc: reading and buffering messages under the bounds, writing
//   replies, refusing a connection;
// - tcp_store_server_requests.cc: the handshake and the requests (the map, parked
//   Get/Wait requests and the keys they wait for).
#ifndef COMM_INTERNAL_TCP_STORE_SERVER_LOOP_H_
#define COMM_INTERNAL_TCP_STORE_SERVER_LOOP_H_

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/internal/socket.h"
#include "comm/internal/store_protocol.h"
#include "comm/internal/tcp_store_server.h"

namespace comm {
namespace internal {

// The event loop and everything it owns. All members but `stop_` and `connections_` are
// touched only by the loop's thread.
class TcpStoreServer::Loop {
 public:
  // epoll tags of the two descriptors that are not connections; connection ids start above.
  static constexpr uint64_t kListenTag = 0;
  static constexpr uint64_t kWakeTag = 1;
  // Bytes read per recv (the size of chunk_).
  static constexpr size_t kChunkBytes = 64 * 1024;

  Loop(const TcpStoreServerOptions& options, int port, Fd listen, Fd epoll, Fd wake,
       std::string nonce_key)
      : options_(options),
        where_(absl::StrCat("TcpStore server ", options.host, ":", port)),
        listen_(std::move(listen)),
        epoll_(std::move(epoll)),
        wake_(std::move(wake)),
        nonce_key_(std::move(nonce_key)),
        chunk_(new char[kChunkBytes]) {}

  void Run();

  // Thread-safe: makes Run return soon.
  void Stop() {
    stop_.store(true);
    const uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof(one));
  }

  int connection_count() const { return connections_.load(); }

 private:
  enum class Phase {
    kHandshake,  // waiting for the client's proof of the secret
    kReady,      // serving requests
    kClosing,    // refused: delivering the error, discarding input, then closing
  };

  // A Get or Wait whose keys are not all set yet.
  struct PendingWait {
    StoreOp op;
    std::vector<std::string> keys;
    absl::Duration timeout;
    absl::Time deadline;
  };

  struct Conn {
    Conn(uint64_t id, int fd, size_t max_frame) : id(id), fd(fd), in(max_frame) {}
    const uint64_t id;
    Fd fd;
    std::string peer;
    Phase phase = Phase::kReady;
    FrameAssembler in;
    std::string out;
    size_t out_pos = 0;
    std::string server_nonce;
    std::optional<PendingWait> wait;
    std::set<std::string> missing;                       // keys of `wait` not seen set yet
    absl::Time in_deadline = absl::InfiniteFuture();     // partial message / handshake
    absl::Time out_deadline = absl::InfiniteFuture();    // reply the client does not read
    absl::Time close_deadline = absl::InfiniteFuture();  // end of kClosing
    absl::Time timer_at = absl::InfiniteFuture();        // its entry in timers_
    uint32_t events = 0;                                 // its epoll interest
  };

  std::string Where(const Conn& c) const { return absl::StrCat(where_, " (client ", c.peer, ")"); }
  bool Busy(const Conn& c) const { return c.wait.has_value() || c.out_pos < c.out.size(); }

  int TimeoutMillis() const;
  void AcceptAll();
  void AddConn(int fd);
  void PauseAccepting(absl::Time now);

  // Each of these returns false when it closed the connection (`c` is gone then).
  bool OnEvent(Conn& c, uint32_t events);
  bool OnReadable(Conn& c, uint32_t events);
  bool Drain(Conn& c);
  bool Flush(Conn& c);
  bool Reply(Conn& c, const absl::Status& status, absl::string_view body = "");
  bool Refuse(Conn& c, const absl::Status& status);
  bool HandleFrame(Conn& c, const std::string& frame);
  bool HandleAuth(Conn& c, const std::string& frame);
  bool Execute(Conn& c, Request& req);
  bool OnTimer(Conn& c, absl::Time now);

  void Park(Conn& c, Request& req);
  void Unpark(Conn& c);
  void KeySet(const std::string& key);
  void Refresh(Conn& c);
  void Close(Conn& c);
  std::vector<std::string> MissingKeys(const std::vector<std::string>& keys) const;

  const TcpStoreServerOptions options_;
  const std::string where_;
  Fd listen_;
  Fd epoll_;
  Fd wake_;
  const std::string nonce_key_;
  uint64_t nonce_counter_ = 0;
  std::unique_ptr<char[]> chunk_;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};

  uint64_t next_id_ = kWakeTag + 1;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
  std::set<std::pair<absl::Time, uint64_t>> timers_;
  bool accept_paused_ = false;
  absl::Time accept_resume_ = absl::InfiniteFuture();
  int64_t buffered_ = 0;  // body bytes of partial messages, all connections

  std::unordered_map<std::string, std::string> map_;
  // Connections waiting on each key.
  std::unordered_map<std::string, std::set<uint64_t>> waiters_;
};

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_TCP_STORE_SERVER_LOOP_H_
