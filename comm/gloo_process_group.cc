#include "comm/gloo_process_group.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/internal/gloo_blame.h"
#include "comm/internal/gloo_store_adapter.h"
#include "comm/internal/reduce.h"
#include "comm/internal/sigpipe.h"
#include "comm/internal/socket.h"
#include "comm/internal/worker_group.h"
#include "comm/prefix_store.h"
#include "core/status_macros.h"
#include "glog/logging.h"

// NOTE [Who is to blame] and NOTE [Connection check] are in comm/internal/gloo_blame.h.

namespace comm {
namespace {

std::chrono::milliseconds ToMillis(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// Gloo's timeout messages ("Timed out waiting ...", "Read timeout ...", "Connect
// timeout ...", "Application timeout caused pair closure").
bool IsGlooTimeout(absl::string_view what) {
  return absl::StrContains(what, "Timed out") || absl::StrContains(what, "timeout") ||
         absl::StrContains(what, "Timeout");
}

uint8_t* Bytes(const core::Tensor& t) { return static_cast<uint8_t*>(t.raw_data()); }

// What `store` puts before a key, for messages: "world/" for PrefixStore(base, "world").
std::string KeyPrefix(const Store* store) {
  std::string prefix;
  while (const auto* p = dynamic_cast<const PrefixStore*>(store)) {
    prefix = absl::StrCat(p->prefix(), "/", prefix);
    store = p->base().get();
  }
  return prefix;
}

}  // namespace

GlooProcessGroup::GlooProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                                   GlooOptions options)
    : BackendGroup(std::move(store), rank, size, options.name),
      options_(std::move(options)),
      worker_(this, &stats(), WorkerHooks()) {}

absl::StatusOr<std::shared_ptr<GlooProcessGroup>> GlooProcessGroup::Create(
    std::shared_ptr<Store> store, int rank, int size, const GlooOptions& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<Store> scoped,
                   internal::GroupStore(std::move(store), "GlooProcessGroup", options.name));
  return Join(std::move(scoped), rank, size, options);
}

absl::StatusOr<std::shared_ptr<GlooProcessGroup>> GlooProcessGroup::Join(
    std::shared_ptr<Store> store, int rank, int size, const GlooOptions& options) {
  const std::string who = internal::JoinWho("gloo", options.name, rank, size);
  RETURN_IF_ERROR(internal::CheckRankAndSize(who, rank, size));
  RETURN_IF_ERROR(
      internal::CheckPositive(who, "GlooOptions.rendezvous_timeout", options.rendezvous_timeout));
  RETURN_IF_ERROR(
      internal::CheckPositive(who, "GlooOptions.store_probe_timeout", options.store_probe_timeout));
  if (options.store_server_rank < -1 || options.store_server_rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": GlooOptions.store_server_rank ",
                                                   options.store_server_rank,
                                                   " is neither -1 nor a rank of the group"));
  }
  // Gloo dereferences a failed getaddrinfo result (a crash, not an error), so resolve
  // and test-bind the address here and hand gloo a dotted quad.
  absl::StatusOr<sockaddr_in> addr = internal::ResolveIPv4(options.hostname, 0);
  if (!addr.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": GlooOptions.hostname: ", addr.status().message()));
  }
  const std::string ip = internal::IPv4ToString(*addr);
  if (absl::StatusOr<internal::Fd> probe = internal::Listen(ip, 0, 1); !probe.ok()) {
    return absl::UnavailableError(
        absl::StrCat(who, ": GlooOptions.hostname \"", options.hostname,
                     "\" is not a local address: ", probe.status().message()));
  }
  // NOTE in comm/internal/sigpipe.h: gloo's threads (the device's event loop, started
  // here, and our worker, started below) inherit a mask with SIGPIPE blocked.
  internal::ScopedBlockSigpipe block_sigpipe;
  std::shared_ptr<GlooProcessGroup> group(
      new GlooProcessGroup(std::move(store), rank, size, options));
  RETURN_IF_ERROR(group->Connect(who, ip));
  group->worker_.Start();
  VLOG(1) << group->Describe() << ": connected on " << options.hostname;
  return group;
}

absl::Status GlooProcessGroup::Connect(const std::string& who, const std::string& ip) {
  const int rank = this->rank();
  const int size = this->size();
  const std::string key_prefix = KeyPrefix(store().get());
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options_.rendezvous_timeout;
  internal::GlooStoreAdapter adapter(store(), rank, size, deadline, key_prefix);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = ip;
    device_ = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    // A pair waits up to 5 times the context timeout for its peer to connect; keep
    // that within rendezvous_timeout (collectives pass their own timeouts).
    context->setTimeout(ToMillis(options_.rendezvous_timeout / 5));
    context->connectFullMesh(adapter, device_);
    context_ = std::move(context);
  } catch (const internal::StoreError& e) {
    if (e.status().code() != absl::StatusCode::kDeadlineExceeded) {
      return core::Annotate(e.status(), absl::StrCat(who, ": rendezvous"));
    }
    return core::Annotate(
        e.status(),
        absl::StrCat(who, ": rendezvous failed after ", absl::FormatDuration(absl::Now() - start),
                     " (rendezvous_timeout ", absl::FormatDuration(options_.rendezvous_timeout),
                     "); keys named below are the ranks that did not join"));
  } catch (const std::exception& e) {
    std::string address;
    const int peer = adapter.listening().RankIn(e.what(), &address);
    const std::string target = peer < 0
                                   ? "the peers"
                                   : absl::StrCat("rank ", peer, " at ", address,
                                                  " (the address in key '", key_prefix, peer, "')");
    return absl::Status(
        IsGlooTimeout(e.what()) ? absl::StatusCode::kDeadlineExceeded
                                : absl::StatusCode::kUnavailable,
        absl::StrCat(who, ": connecting to ", target, " from ", options_.hostname,
                     " failed (rendezvous_timeout ",
                     absl::FormatDuration(options_.rendezvous_timeout), "): ", e.what()));
  } catch (...) {
    return absl::InternalError(
        absl::StrCat(who, ": rendezvous: gloo threw something that is not an exception"));
  }
  if (size == 1) return absl::OkStatus();
  absl::StatusOr<internal::PeerDirectory> peers =
      internal::ConfirmConnections(*store(), *context_, rank, size, deadline,
                                   options_.rendezvous_timeout, key_prefix, adapter.listening());
  if (!peers.ok()) return core::Annotate(peers.status(), absl::StrCat(who, ": rendezvous"));
  internal::BlameOptions blame;
  blame.rank = rank;
  blame.size = size;
  blame.group = who;
  blame.store_name = store()->Describe();
  blame.store_server_rank = options_.store_server_rank;
  blame.probe_timeout = options_.store_probe_timeout;
  blame_ = std::make_shared<internal::GlooBlame>(store(), blame, *std::move(peers));
  return absl::OkStatus();
}

GlooProcessGroup::~GlooProcessGroup() {
  worker_.Stop();
  // Tell the peers why this rank's connections close (NOTE [Who is to blame]).
  if (blame_ != nullptr && !worker_.broken()) blame_->RecordDestroyed();
  context_.reset();
  device_.reset();
  blame_.reset();
}

internal::CollectiveWorker::Hooks GlooProcessGroup::WorkerHooks() {
  internal::CollectiveWorker::Hooks hooks;
  hooks.thread_init = [] { internal::BlockSigpipeForThisThread(); };
  hooks.on_enqueue = [this](CompletionWork& work, const internal::QueuedOp& op) {
    if (blame_ == nullptr) return;
    // A caller's Wait that ends first names the ranks that did not arrive, as the
    // collective's own deadline would (NOTE [Who is to blame]).
    std::weak_ptr<internal::GlooBlame> blame = blame_;
    work.SetTimeoutDiagnosis([blame, seq = op.seq, timeout = op.timeout](const std::string& what) {
      constexpr char kRunning[] = "still running when the wait ended";
      if (std::shared_ptr<internal::GlooBlame> b = blame.lock()) {
        return b->Diagnose(what, seq, timeout, /*gloo_timeout=*/true, kRunning);
      }
      return absl::DeadlineExceededError(absl::StrCat(what, ": ", kRunning));
    });
  };
  // NOTE [Who is to blame]: this rank has arrived at collective #seq.
  hooks.on_start = [this](const internal::QueuedOp& op) {
    if (blame_ != nullptr) blame_->Arrived(op.seq);
  };
  hooks.on_break = [this](const absl::Status& failure) {
    if (blame_ != nullptr) blame_->RecordFailure(failure);
    // Peers may be blocked receiving from this rank; closing the connections makes
    // them fail now instead of at their deadlines (gloo signals a closed pair at once).
    try {
      context_->closeConnections();
    } catch (const std::exception& e) {
      LOG(WARNING) << Describe() << ": closing connections after a failure: " << e.what();
    } catch (...) {
      LOG(WARNING) << Describe() << ": closing connections after a failure threw";
    }
  };
  return hooks;
}

std::shared_ptr<Work> GlooProcessGroup::Enqueue(CollectiveKind kind, absl::Duration timeout,
                                                Traffic traffic, RunFn run) {
  return worker_.Enqueue(
      kind, timeout, traffic,
      [this, run = std::move(run)](const internal::QueuedOp& op) { return RunOp(op, run); });
}

absl::Status GlooProcessGroup::RunOp(const internal::QueuedOp& op, const RunFn& run) {
  const std::string& what = op.what;
  try {
    return core::Annotate(run(static_cast<uint32_t>(op.seq), ToMillis(op.deadline - absl::Now())),
                          what);
  } catch (const gloo::IoException& e) {
    const bool timeout = IsGlooTimeout(e.what());
    if (blame_ != nullptr) {
      return blame_->Diagnose(what, op.seq, op.timeout, timeout, e.what());
    }
    return absl::Status(
        timeout ? absl::StatusCode::kDeadlineExceeded : absl::StatusCode::kUnavailable,
        absl::StrCat(what, " failed: ", e.what()));
  } catch (const gloo::EnforceNotMet& e) {
    return absl::InternalError(absl::StrCat(what, ": gloo check failed: ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  } catch (...) {
    return absl::InternalError(
        absl::StrCat(what, ": gloo threw something that is not an exception"));
  }
}

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::AllGather(const core::Tensor& input,
                                                                  const core::Tensor& output,
                                                                  const AllGatherOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kAllGather;
  RETURN_IF_ERROR(ValidateAllGather(*this, input, output, options));
  RETURN_IF_ERROR(ValidateDevice(*this, kind, {&input, &output}, core::Device::Cpu()));
  RETURN_IF_ERROR(worker_.CheckUsable(kind));
  const bool in_place = input.SharesStorage(output) && input.numel() > 0 &&
                        input.offset() == output.offset() + rank() * input.numel();
  const int n = size();
  auto context = context_;
  const core::Tensor stage_from = options.stage_from;
  return Enqueue(kind, options.timeout, ExpectedTraffic(kind, output.nbytes(), n, rank()),
                 [=](uint32_t tag, std::chrono::milliseconds left) -> absl::Status {
                   if (input.numel() == 0) return absl::OkStatus();
                   RETURN_IF_ERROR(StageIn(input, stage_from));
                   if (n == 1 || in_place) {
                     if (!in_place) std::memcpy(Bytes(output), Bytes(input), input.nbytes());
                     if (n == 1) return absl::OkStatus();
                   }
                   gloo::AllgatherOptions o(context);
                   if (!in_place) o.setInput<uint8_t>(Bytes(input), input.nbytes());
                   o.setOutput<uint8_t>(Bytes(output), output.nbytes());
                   o.setTag(tag);
                   o.setTimeout(left);
                   gloo::allgather(o);
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::ReduceScatter(
    const core::Tensor& input, const core::Tensor& output, const ReduceScatterOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kReduceScatter;
  RETURN_IF_ERROR(ValidateReduceScatter(*this, input, output, options));
  RETURN_IF_ERROR(ValidateDevice(*this, kind, {&input, &output}, core::Device::Cpu()));
  RETURN_IF_ERROR(worker_.CheckUsable(kind));
  const ReduceOp op = options.reduce_op;
  return Enqueue(
      kind, options.timeout, ExpectedTraffic(kind, input.nbytes(), size(), rank()),
      [this, input, output, op, unstage_to = options.unstage_to, into = options.accumulate_into](
          uint32_t tag, std::chrono::milliseconds left) -> absl::Status {
        RETURN_IF_ERROR(RunReduceScatter(input, output, op, tag, left));
        RETURN_IF_ERROR(StageOut(output, unstage_to));
        return AccumulateOut(output, into);
      });
}

// NOTE [Pipelined reduce-scatter]: chunk j of every rank's input goes to rank j, in
// pieces of at most kReduceScatterPieceBytes, each piece on its own slot. A rank posts
// all its sends at once and receives each peer's pieces into a ring of two piece-sized
// scratch buffers per peer (kept by the group, so nothing is allocated per call, and
// bounded whatever the unit size). Piece p is reduced, in rank order as ReduceChunkList
// does (identical bits on every rank), as soon as every peer's piece p is in, while
// piece p + 1 is still arriving; then its scratch takes piece p + 2.
absl::Status GlooProcessGroup::RunReduceScatter(const core::Tensor& input,
                                                const core::Tensor& output, ReduceOp op,
                                                uint32_t tag, std::chrono::milliseconds left) {
  const int n = size();
  const int64_t k = output.numel();
  if (k == 0) return absl::OkStatus();
  if (n == 1) {
    if (!output.SharesStorage(input) || output.offset() != input.offset()) {
      std::memcpy(Bytes(output), Bytes(input), input.nbytes());
    }
    return absl::OkStatus();
  }
  const size_t esize = static_cast<size_t>(core::DTypeSize(input.dtype()));
  const int64_t piece = std::max<int64_t>(
      1, std::min<int64_t>(k, kReduceScatterPieceBytes / static_cast<int64_t>(esize)));
  const int64_t pieces = (k + piece - 1) / piece;
  if (pieces > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reduce-scatter of ", k, " elements per rank needs ", pieces, " pieces, more than 2^24"));
  }
  const size_t piece_bytes = static_cast<size_t>(piece) * esize;
  // Scratch: peer slot q (the q-th rank other than this one) x ring entry r.
  ASSIGN_OR_RETURN(uint8_t * scratch,
                   ReduceScatterScratch(static_cast<int64_t>(n - 1) * 2 * piece_bytes));
  const auto peer_slot = [this](int j) { return j < rank() ? j : j - 1; };
  const uint64_t base = gloo::Slot::build(gloo::kAlltoallSlotPrefix, tag);
  const auto deadline = std::chrono::steady_clock::now() + left;
  const auto remaining = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now()));
  };
  const auto piece_len = [&](int64_t p) { return std::min(piece, k - p * piece); };

  std::unique_ptr<gloo::transport::UnboundBuffer> in =
      context_->createUnboundBuffer(Bytes(input), input.nbytes());
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> bufs;  // [peer slot][ring]
  bufs.reserve(static_cast<size_t>(n - 1) * 2);
  for (int q = 0; q < n - 1; ++q) {
    for (int r = 0; r < 2; ++r) {
      bufs.push_back(context_->createUnboundBuffer(
          scratch + (static_cast<size_t>(q) * 2 + r) * piece_bytes, piece_bytes));
    }
  }
  const auto buf = [&](int j, int64_t p) {
    return bufs[static_cast<size_t>(peer_slot(j)) * 2 + static_cast<size_t>(p % 2)].get();
  };
  const auto post_recv = [&](int64_t p) {
    for (int j = 0; j < n; ++j) {
      if (j != rank()) buf(j, p)->recv(j, base + p, 0, piece_len(p) * esize);
    }
  };
  for (int64_t p = 0; p < pieces; ++p) {
    for (int i = 1; i < n; ++i) {
      const int j = (rank() + i) % n;
      in->send(j, base + p, (static_cast<size_t>(j) * k + p * piece) * esize, piece_len(p) * esize);
    }
  }
  post_recv(0);
  if (pieces > 1) post_recv(1);
  std::vector<const void*> chunks(static_cast<size_t>(n));
  const uint8_t* own = Bytes(input) + static_cast<size_t>(rank()) * k * esize;
  for (int64_t p = 0; p < pieces; ++p) {
    for (int j = 0; j < n; ++j) {
      if (j == rank()) {
        chunks[j] = own + p * piece * esize;
      } else {
        if (!buf(j, p)->waitRecv(remaining())) return absl::AbortedError("receive aborted");
        chunks[j] = buf(j, p)->ptr;
      }
    }
    internal::ReduceChunkList(input.dtype(), op, chunks.data(), n, piece_len(p),
                              Bytes(output) + p * piece * esize);
    if (p + 2 < pieces) post_recv(p + 2);
  }
  for (int64_t i = 0; i < pieces * (n - 1); ++i) {
    if (!in->waitSend(remaining())) return absl::AbortedError("send aborted");
  }
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> GlooProcessGroup::ReduceScatterScratch(int64_t bytes) {
  if (!reduce_scatter_scratch_.defined() || reduce_scatter_scratch_.nbytes() < bytes) {
    reduce_scatter_scratch_ = core::Tensor();
    absl::StatusOr<core::Tensor> scratch =
        core::Tensor::Allocate({(bytes + 3) / 4}, core::DType::kFloat32, core::MemoryTag::kComm);
    if (!scratch.ok()) return scratch.status();
    reduce_scatter_scratch_ = *std::move(scratch);
  }
  return Bytes(reduce_scatter_scratch_);
}

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::AllReduce(const core::Tensor& tensor,
                                                                  const AllReduceOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kAllReduce;
  RETURN_IF_ERROR(ValidateAllReduce(*this, tensor, options));
  RETURN_IF_ERROR(ValidateDevice(*this, kind, {&tensor}, core::Device::Cpu()));
  RETURN_IF_ERROR(worker_.CheckUsable(kind));
  const int n = size();
  const ReduceOp op = options.reduce_op;
  auto context = context_;
  auto run = [=](uint32_t tag, std::chrono::milliseconds left) -> absl::Status {
    if (tensor.numel() == 0 || n == 1) return absl::OkStatus();
    // bf16 is reduced in an fp32 copy and rounded back once.
    core::Tensor buf = tensor;
    if (tensor.dtype() == core::DType::kBFloat16) {
      absl::StatusOr<core::Tensor> wide =
          tensor.ToDType(core::DType::kFloat32, core::MemoryTag::kComm);
      if (!wide.ok()) return wide.status();
      buf = *std::move(wide);
    }
    const core::DType dtype = buf.dtype();
    const ReduceOp pair_op = op == ReduceOp::kMax ? ReduceOp::kMax : ReduceOp::kSum;
    gloo::AllreduceOptions o(context);
    if (dtype == core::DType::kInt32) {
      o.setOutput<int32_t>(buf.data<int32_t>(), buf.numel());
    } else {
      o.setOutput<float>(buf.data<float>(), buf.numel());
    }
    if (dtype == core::DType::kFloat32 && pair_op == ReduceOp::kSum) {
      // gloo's own fp32 sum (c = a + b, the same bits as ReducePair).
      o.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    } else {
      o.setReduceFunction([dtype, pair_op](void* c, const void* a, const void* b, size_t count) {
        internal::ReducePair(dtype, pair_op, c, a, b, count);
      });
    }
    o.setTag(tag);
    o.setTimeout(left);
    gloo::allreduce(o);
    if (op == ReduceOp::kAverage) internal::DivideInPlace(buf.data<float>(), buf.numel(), n);
    if (!buf.SharesStorage(tensor)) return tensor.CopyFrom(buf);
    return absl::OkStatus();
  };
  return Enqueue(kind, options.timeout, ExpectedTraffic(kind, tensor.nbytes(), n, rank()),
                 [run, tensor, unstage_to = options.unstage_to](
                     uint32_t tag, std::chrono::milliseconds left) -> absl::Status {
                   RETURN_IF_ERROR(run(tag, left));
                   return StageOut(tensor, unstage_to);
                 });
}

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::Broadcast(const core::Tensor& tensor,
                                                                  const BroadcastOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kBroadcast;
  RETURN_IF_ERROR(ValidateBroadcast(*this, tensor, options));
  RETURN_IF_ERROR(ValidateDevice(*this, kind, {&tensor}, core::Device::Cpu()));
  RETURN_IF_ERROR(worker_.CheckUsable(kind));
  const int n = size();
  const int root = options.root;
  auto context = context_;
  return Enqueue(kind, options.timeout,
                 ExpectedTraffic(kind, tensor.nbytes(), n, rank(), options.root),
                 [=](uint32_t tag, std::chrono::milliseconds left) -> absl::Status {
                   if (tensor.numel() == 0 || n == 1) return absl::OkStatus();
                   gloo::BroadcastOptions o(context);
                   o.setOutput<uint8_t>(Bytes(tensor), tensor.nbytes());
                   o.setRoot(root);
                   o.setTag(tag);
                   o.setTimeout(left);
                   gloo::broadcast(o);
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::Barrier(const BarrierOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kBarrier;
  RETURN_IF_ERROR(ValidateBarrier(*this, options));
  RETURN_IF_ERROR(worker_.CheckUsable(kind));
  const int n = size();
  auto context = context_;
  return Enqueue(kind, options.timeout, Traffic{},
                 [=](uint32_t tag, std::chrono::milliseconds left) -> absl::Status {
                   if (n == 1) return absl::OkStatus();
                   gloo::BarrierOptions o(context);
                   o.setTag(tag);
                   o.setTimeout(left);
                   gloo::barrier(o);
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> GlooProcessGroup::NewSubgroup(
    const std::vector<int>& ranks, const SubgroupOptions& options) {
  ASSIGN_OR_RETURN(SubgroupPlacement place, PlaceNextSubgroup(ranks));
  GlooOptions sub = options_;
  sub.name = SubgroupName(options, place);
  sub.rendezvous_timeout = options.timeout;
  auto server = std::find(ranks.begin(), ranks.end(), options_.store_server_rank);
  sub.store_server_rank = server == ranks.end() ? -1 : static_cast<int>(server - ranks.begin());
  ASSIGN_OR_RETURN(std::shared_ptr<GlooProcessGroup> group,
                   Join(SubgroupStore(place), place.rank, place.size, sub));
  return std::shared_ptr<ProcessGroup>(std::move(group));
}

}  // namespace comm
