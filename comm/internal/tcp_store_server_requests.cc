// The handshake and the requests of a TcpStoreServer::Loop: the map, Get/Wait requests
// parked until their keys are set or their deadline passes, and the keys they wait for.
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/internal/sha256.h"
#include "comm/internal/store_protocol.h"
#include "comm/internal/store_util.h"
#include "comm/internal/tcp_store_server_loop.h"
#include "glog/logging.h"

namespace comm {
namespace internal {

bool TcpStoreServer::Loop::HandleFrame(Conn& c, const std::string& frame) {
  if (c.phase == Phase::kHandshake) return HandleAuth(c, frame);
  absl::StatusOr<Request> req = ParseRequest(frame);
  if (!req.ok()) {
    return Reply(c,
                 absl::InvalidArgumentError(absl::StrCat(Where(c), ": ", req.status().message())));
  }
  return Execute(c, *req);
}

bool TcpStoreServer::Loop::HandleAuth(Conn& c, const std::string& frame) {
  absl::StatusOr<AuthProof> proof = ParseAuthProof(frame);
  if (!proof.ok() || !ConstantTimeEquals(proof->mac, ClientProof(options_.secret, c.server_nonce,
                                                                 proof->client_nonce))) {
    LOG_EVERY_N(WARNING, 100) << Where(c)
                              << ": a client failed to prove it knows the job secret "
                                 "(FSDP_JOB_SECRET); closed its connection";
    return Refuse(c, absl::PermissionDeniedError(
                         absl::StrCat(Where(c),
                                      ": authentication failed: the job secret (FSDP_JOB_SECRET) "
                                      "does not match")));
  }
  c.phase = Phase::kReady;
  c.in_deadline = absl::InfiniteFuture();
  c.in.set_max_frame_bytes(options_.max_frame_bytes);
  return Reply(c, absl::OkStatus(),
               ServerProof(options_.secret, c.server_nonce, proof->client_nonce));
}

bool TcpStoreServer::Loop::Execute(Conn& c, Request& req) {
  switch (req.op) {
    case StoreOp::kSet:
      map_[req.key] = std::move(req.value);
      KeySet(req.key);
      return Reply(c, absl::OkStatus());
    case StoreOp::kGet: {
      auto it = map_.find(req.key);
      if (it != map_.end()) return Reply(c, absl::OkStatus(), it->second);
      Park(c, req);
      return true;
    }
    case StoreOp::kAdd: {
      auto it = map_.find(req.key);
      absl::StatusOr<int64_t> sum =
          AddToCounter("TcpStore", req.key, it == map_.end() ? nullptr : &it->second, req.delta);
      if (!sum.ok()) return Reply(c, sum.status());
      map_[req.key] = absl::StrCat(*sum);
      KeySet(req.key);
      return Reply(c, absl::OkStatus(), EncodeI64(*sum));
    }
    case StoreOp::kWait:
      if (MissingKeys(req.keys).empty()) return Reply(c, absl::OkStatus());
      Park(c, req);
      return true;
    case StoreOp::kCheck:
      return Reply(c, absl::OkStatus(), EncodeBool(MissingKeys(req.keys).empty()));
    case StoreOp::kDelete:
      return Reply(c, absl::OkStatus(), EncodeBool(map_.erase(req.key) > 0));
  }
  return Reply(c, absl::InvalidArgumentError(absl::StrCat(Where(c), ": unknown request")));
}

std::vector<std::string> TcpStoreServer::Loop::MissingKeys(
    const std::vector<std::string>& keys) const {
  std::vector<std::string> missing;
  for (const std::string& k : keys) {
    if (map_.find(k) == map_.end()) missing.push_back(k);
  }
  return missing;
}

void TcpStoreServer::Loop::Park(Conn& c, Request& req) {
  PendingWait w;
  w.op = req.op;
  w.keys = req.op == StoreOp::kGet ? std::vector<std::string>{req.key} : std::move(req.keys);
  w.timeout = absl::Milliseconds(req.timeout_ms);
  w.deadline = absl::Now() + w.timeout;
  for (std::string& k : MissingKeys(w.keys)) {
    waiters_[k].insert(c.id);
    c.missing.insert(std::move(k));
  }
  c.wait = std::move(w);
}

void TcpStoreServer::Loop::Unpark(Conn& c) {
  for (const std::string& k : c.missing) {
    auto it = waiters_.find(k);
    if (it == waiters_.end()) continue;
    it->second.erase(c.id);
    if (it->second.empty()) waiters_.erase(it);
  }
  c.missing.clear();
  c.wait.reset();
}

void TcpStoreServer::Loop::KeySet(const std::string& key) {
  auto found = waiters_.find(key);
  if (found == waiters_.end()) return;
  const std::set<uint64_t> ids = std::move(found->second);
  waiters_.erase(found);
  for (uint64_t id : ids) {
    auto it = conns_.find(id);
    if (it == conns_.end() || !it->second->wait.has_value()) continue;
    Conn& w = *it->second;
    w.missing.erase(key);
    if (!w.missing.empty()) continue;
    // Every key was seen set; check again in case one was deleted since.
    for (std::string& k : MissingKeys(w.wait->keys)) {
      waiters_[k].insert(w.id);
      w.missing.insert(std::move(k));
    }
    if (!w.missing.empty()) continue;
    const std::string body =
        w.wait->op == StoreOp::kGet ? map_.at(w.wait->keys.front()) : std::string();
    w.wait.reset();
    if (Reply(w, absl::OkStatus(), body)) Refresh(w);
  }
}

}  // namespace internal
}  // namespace comm
