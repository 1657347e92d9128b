#include "comm/internal/shm_collectives.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "comm/internal/reduce.h"
#include "comm/internal/shm_copy.h"
#include "core/dtype.h"
#include "core/status_macros.h"

// NOTE [CMA transport]: with cross-memory attach a collective's bulk data does not go
// through the slots: a rank stores, in its control block, the address (in its own
// process) and byte length of the buffer its peers read (`buffer`, `buffer_bytes`), then
// publishes the step; a peer that sees the step reads the address and copies straight
// from the owner's process with process_vm_readv (retrying partial counts). Each CMA
// collective is one step (all-reduce: two), and every owner waits at its end until each
// peer's `consumed` counter says it has finished reading (WaitConsumed): only then may
// its caller reuse the tensor, and only then does it overwrite `buffer` for the next
// collective. The counters keep counting steps, so slot and CMA collectives mix freely
// (the choice is a function of the sizes, the same on every rank).
//   all-gather: publish the input; copy it to the own block of the output; read each
//     peer's input into its block of the output.
//   reduce-scatter: publish the input; for each piece of the own chunk (cma_piece_bytes_
//     per peer, so the pieces of all peers stay in L2) read it from each peer into
//     scratch, then reduce all ranks' pieces in rank order into the output (the same
//     code, so the same bits, as the slots).
//   all-reduce: publish the tensor; reduce-scatter the own chunk in place as above; then
//     publish step s + 1 (the own chunk is final) and read each peer's chunk from it
//     once it published s + 1 (it has then also finished reading this rank's chunks).
//   broadcast: the root publishes the tensor, the others read it.
// A probe at Create (ChooseTransport) reads a word of every peer; the store carries
// every rank's result so all ranks choose the same transport.

namespace comm {
namespace internal {
namespace {

uint8_t* Bytes(const core::Tensor& t) { return static_cast<uint8_t*>(t.raw_data()); }

// Bytes of one peer's piece in a CMA reduction: the pieces of all peers fit in a slot.
int64_t CmaPieceBytes(int64_t slot_bytes, int n) {
  const int64_t per_peer = slot_bytes / std::max(1, n - 1) / 64 * 64;
  return std::max<int64_t>(64, per_peer);
}

// Bytes of a reduce-scatter slot's sub-slot per destination rank (64-byte aligned).
int64_t SubSlotBytes(int64_t slot_bytes, int n) { return slot_bytes / n / 64 * 64; }

int64_t Clip(int64_t v, int64_t lo, int64_t hi) { return std::max(lo, std::min(v, hi)); }

// All-reduce's chunks: m elements over n ranks, the first m % n chunks one element longer.
struct ChunkSplit {
  ChunkSplit(int64_t m, int n) : base(m / n), rem(m % n) {}
  int64_t begin(int q) const { return q * base + std::min<int64_t>(q, rem); }
  int64_t count(int q) const { return base + (q < rem ? 1 : 0); }
  int64_t longest() const { return base + (rem > 0 ? 1 : 0); }
  int64_t base;
  int64_t rem;
};

}  // namespace

ShmCollectives::ShmCollectives(std::unique_ptr<ShmSegment> segment, int rank, int size,
                               const ShmOptions& options, bool cma)
    : segment_(std::move(segment)),
      rank_(rank),
      size_(size),
      options_(options),
      cma_(cma),
      cma_piece_bytes_(CmaPieceBytes(options.slot_bytes, size)) {}

absl::StatusOr<uint8_t*> ShmCollectives::CmaScratch() {
  const int64_t bytes = cma_piece_bytes_ * (size_ - 1);
  if (!cma_scratch_.defined()) {
    absl::StatusOr<core::Tensor> scratch =
        core::Tensor::Allocate({(bytes + 3) / 4}, core::DType::kFloat32, core::MemoryTag::kComm);
    if (!scratch.ok()) return scratch.status();
    cma_scratch_ = *std::move(scratch);
  }
  return static_cast<uint8_t*>(cma_scratch_.raw_data());
}

absl::Status ShmCollectives::AllGather(const core::Tensor& input, const core::Tensor& output,
                                       const QueuedOp& call) {
  if (UseCma(input.nbytes())) return AllGatherCma(input, output, call);
  const int n = size_;
  const int64_t bytes = input.nbytes();
  const bool in_place = input.SharesStorage(output) && input.numel() > 0 &&
                        input.offset() == output.offset() + rank_ * input.numel();
  if (bytes == 0) return absl::OkStatus();
  const uint8_t* in = Bytes(input);
  uint8_t* out = Bytes(output);
  if (n == 1) {
    if (!in_place) std::memcpy(out, in, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  const int64_t piece = options_.slot_bytes;
  const int64_t pieces = (bytes + piece - 1) / piece;
  const bool streaming = output.nbytes() >= kStreamingBytes;
  ShmStepper st(*segment_, rank_, call, options_);
  for (int64_t i = 0; i < pieces; ++i) {
    const uint64_t s = step_ + static_cast<uint64_t>(i);
    const int64_t off = i * piece;
    const size_t len = static_cast<size_t>(std::min(piece, bytes - off));
    RETURN_IF_ERROR(st.BeginWrite(s));
    if (in_place) {
      std::memcpy(segment_->slot(rank_, s), in + off, len);
    } else {
      CopyTwice(segment_->slot(rank_, s), out + rank_ * bytes + off, in + off, len, streaming);
    }
    st.Publish(s);
    for (int d = 1; d < n; ++d) {
      const int p = (rank_ + d) % n;
      RETURN_IF_ERROR(st.WaitPublished(s, p));
      CopyOut(out + p * bytes + off, segment_->slot(p, s), len, streaming);
    }
    st.Consumed(s);
  }
  StreamFence();
  step_ += static_cast<uint64_t>(pieces);
  return absl::OkStatus();
}

absl::Status ShmCollectives::ReduceScatter(const core::Tensor& input, const core::Tensor& output,
                                           ReduceOp op, const QueuedOp& call) {
  if (UseCma(input.nbytes())) {
    return ReduceScatterCma(input, output, op, call);
  }
  const int n = size_;
  const int64_t k = output.numel();
  if (k == 0) return absl::OkStatus();
  const uint8_t* in = Bytes(input);
  uint8_t* out = Bytes(output);
  const int64_t esize = core::DTypeSize(input.dtype());
  if (n == 1) {
    if (!output.SharesStorage(input) || output.offset() != input.offset()) {
      std::memcpy(out, in, static_cast<size_t>(input.nbytes()));
    }
    return absl::OkStatus();
  }
  const int64_t sub = SubSlotBytes(options_.slot_bytes, n);
  const int64_t piece = sub / esize;  // elements per destination and step
  const int64_t pieces = (k + piece - 1) / piece;
  const bool streaming = input.nbytes() >= kStreamingBytes;  // the bytes it streams through
  std::vector<const void*> chunks(static_cast<size_t>(n));
  ShmStepper st(*segment_, rank_, call, options_);
  for (int64_t i = 0; i < pieces; ++i) {
    const uint64_t s = step_ + static_cast<uint64_t>(i);
    const int64_t off = i * piece;
    const int64_t len = std::min(piece, k - off);
    RETURN_IF_ERROR(st.BeginWrite(s));
    uint8_t* mine = segment_->slot(rank_, s);
    for (int q = 0; q < n; ++q) {
      if (q == rank_) continue;
      std::memcpy(mine + q * sub, in + (q * k + off) * esize, static_cast<size_t>(len * esize));
    }
    st.Publish(s);
    RETURN_IF_ERROR(st.WaitPublished(s, -1));
    for (int j = 0; j < n; ++j) {
      chunks[j] = j == rank_ ? static_cast<const void*>(in + (rank_ * k + off) * esize)
                             : static_cast<const void*>(segment_->slot(j, s) + rank_ * sub);
    }
    RETURN_IF_ERROR(
        ReducePiece(input.dtype(), op, chunks.data(), len, out + off * esize, streaming));
    st.Consumed(s);
  }
  StreamFence();
  step_ += static_cast<uint64_t>(pieces);
  return absl::OkStatus();
}

absl::Status ShmCollectives::ReducePiece(core::DType dtype, ReduceOp op, const void* const* chunks,
                                         int64_t len, uint8_t* out, bool streaming) {
  const int64_t bytes = len * core::DTypeSize(dtype);
  if (!streaming) {
    ReduceChunkList(dtype, op, chunks, size_, len, out);
    return absl::OkStatus();
  }
  if (dtype == core::DType::kFloat32 && StreamReduceFloat(op, chunks, size_, len, out)) {
    return absl::OkStatus();
  }
  if (!reduce_scratch_.defined() || reduce_scratch_.nbytes() < bytes) {
    reduce_scratch_ = core::Tensor();
    absl::StatusOr<core::Tensor> scratch = core::Tensor::Allocate(
        {(std::max(bytes, SubSlotBytes(options_.slot_bytes, size_)) + 3) / 4},
        core::DType::kFloat32, core::MemoryTag::kComm);
    if (!scratch.ok()) return scratch.status();
    reduce_scratch_ = *std::move(scratch);
  }
  ReduceChunkList(dtype, op, chunks, size_, len, reduce_scratch_.raw_data());
  CopyOut(out, reduce_scratch_.raw_data(), static_cast<size_t>(bytes), true);
  return absl::OkStatus();
}

// Reduce-scatter of the tensor's n chunks (chunk q: the q-th of n near-equal parts, the
// first m % n one element longer) into each rank's own chunk in place, then an
// all-gather of the chunks; the same rank-order sums as ReduceScatter.
absl::Status ShmCollectives::AllReduce(const core::Tensor& tensor, ReduceOp op,
                                       const QueuedOp& call) {
  if (UseCma(tensor.nbytes())) return AllReduceCma(tensor, op, call);
  const int n = size_;
  const int64_t m = tensor.numel();
  if (m == 0 || n == 1) return absl::OkStatus();
  uint8_t* t = Bytes(tensor);
  const int64_t esize = core::DTypeSize(tensor.dtype());
  const ChunkSplit split(m, n);
  const auto begin = [&](int q) { return split.begin(q); };
  const auto count = [&](int q) { return split.count(q); };
  const int64_t longest = split.longest();
  ShmStepper st(*segment_, rank_, call, options_);
  const bool streaming = tensor.nbytes() >= kStreamingBytes;
  // Reduce-scatter phase.
  const int64_t sub = SubSlotBytes(options_.slot_bytes, n);
  const int64_t piece = sub / esize;
  const int64_t pieces = (longest + piece - 1) / piece;
  std::vector<const void*> chunks(static_cast<size_t>(n));
  for (int64_t i = 0; i < pieces; ++i) {
    const uint64_t s = step_ + static_cast<uint64_t>(i);
    const int64_t off = i * piece;
    RETURN_IF_ERROR(st.BeginWrite(s));
    uint8_t* mine = segment_->slot(rank_, s);
    for (int q = 0; q < n; ++q) {
      if (q == rank_) continue;
      const int64_t len = Clip(count(q) - off, 0, piece);
      std::memcpy(mine + q * sub, t + (begin(q) + off) * esize, static_cast<size_t>(len * esize));
    }
    st.Publish(s);
    RETURN_IF_ERROR(st.WaitPublished(s, -1));
    const int64_t len = Clip(count(rank_) - off, 0, piece);
    uint8_t* own = t + (begin(rank_) + off) * esize;
    for (int j = 0; j < n; ++j) {
      chunks[j] = j == rank_ ? static_cast<const void*>(own)
                             : static_cast<const void*>(segment_->slot(j, s) + rank_ * sub);
    }
    RETURN_IF_ERROR(ReducePiece(tensor.dtype(), op, chunks.data(), len, own, streaming));
    st.Consumed(s);
  }
  step_ += static_cast<uint64_t>(pieces);
  StreamFence();  // the reduced chunk is read back below
  // All-gather phase, in whole-slot pieces.
  const int64_t gpiece = options_.slot_bytes / esize;
  const int64_t gpieces = (longest + gpiece - 1) / gpiece;
  for (int64_t i = 0; i < gpieces; ++i) {
    const uint64_t s = step_ + static_cast<uint64_t>(i);
    const int64_t off = i * gpiece;
    RETURN_IF_ERROR(st.BeginWrite(s));
    const int64_t len = Clip(count(rank_) - off, 0, gpiece);
    std::memcpy(segment_->slot(rank_, s), t + (begin(rank_) + off) * esize,
                static_cast<size_t>(len * esize));
    st.Publish(s);
    for (int d = 1; d < n; ++d) {
      const int p = (rank_ + d) % n;
      RETURN_IF_ERROR(st.WaitPublished(s, p));
      const int64_t plen = Clip(count(p) - off, 0, gpiece);
      CopyOut(t + (begin(p) + off) * esize, segment_->slot(p, s), static_cast<size_t>(plen * esize),
              streaming);
    }
    st.Consumed(s);
  }
  StreamFence();
  step_ += static_cast<uint64_t>(gpieces);
  return absl::OkStatus();
}

absl::Status ShmCollectives::Broadcast(const core::Tensor& tensor, int root, const QueuedOp& call) {
  if (UseCma(tensor.nbytes())) return BroadcastCma(tensor, root, call);
  const int64_t bytes = tensor.nbytes();
  if (bytes == 0 || size_ == 1) return absl::OkStatus();
  uint8_t* t = Bytes(tensor);
  const int64_t piece = options_.slot_bytes;
  const int64_t pieces = (bytes + piece - 1) / piece;
  const bool streaming = bytes >= kStreamingBytes;
  ShmStepper st(*segment_, rank_, call, options_);
  for (int64_t i = 0; i < pieces; ++i) {
    const uint64_t s = step_ + static_cast<uint64_t>(i);
    const int64_t off = i * piece;
    const size_t len = static_cast<size_t>(std::min(piece, bytes - off));
    if (rank_ == root) {
      RETURN_IF_ERROR(st.BeginWrite(s));
      std::memcpy(segment_->slot(root, s), t + off, len);
      st.Publish(s);
    } else {
      st.Publish(s);
      RETURN_IF_ERROR(st.WaitPublished(s, root));
      CopyOut(t + off, segment_->slot(root, s), len, streaming);
    }
    st.Consumed(s);
  }
  StreamFence();
  step_ += static_cast<uint64_t>(pieces);
  return absl::OkStatus();
}

absl::Status ShmCollectives::ReduceFromPeersCma(ShmStepper& st, core::DType dtype, ReduceOp op,
                                                const uint8_t* own, int64_t buf_bytes, int64_t at,
                                                int64_t elems, uint8_t* out, uint8_t* scratch,
                                                bool streaming) {
  const int n = size_;
  const int64_t esize = core::DTypeSize(dtype);
  const int64_t piece = cma_piece_bytes_ / esize;  // elements per peer and read
  std::vector<const void*> chunks(static_cast<size_t>(n));
  for (int64_t off = 0; off < elems; off += piece) {
    const int64_t len = std::min(piece, elems - off);
    const int64_t from = at + off * esize;
    for (int j = 0, slot = 0; j < n; ++j) {
      if (j == rank_) {
        chunks[j] = own + from;
        continue;
      }
      uint8_t* dst = scratch + (slot++) * cma_piece_bytes_;
      RETURN_IF_ERROR(st.ReadPeer(j, buf_bytes, from, dst, len * esize));
      chunks[j] = dst;
    }
    RETURN_IF_ERROR(ReducePiece(dtype, op, chunks.data(), len, out + off * esize, streaming));
  }
  return absl::OkStatus();
}

absl::Status ShmCollectives::AllGatherCma(const core::Tensor& input, const core::Tensor& output,
                                          const QueuedOp& call) {
  const int n = size_;
  const int64_t bytes = input.nbytes();
  const bool in_place =
      input.SharesStorage(output) && input.offset() == output.offset() + rank_ * input.numel();
  const uint8_t* in = Bytes(input);
  uint8_t* out = Bytes(output);
  const bool streaming = output.nbytes() >= kStreamingBytes;
  ShmStepper st(*segment_, rank_, call, options_);
  const uint64_t s = step_;
  st.PublishBuffer(s, in, bytes);
  if (!in_place) CopyOut(out + rank_ * bytes, in, static_cast<size_t>(bytes), streaming);
  for (int d = 1; d < n; ++d) {
    const int p = (rank_ + d) % n;
    RETURN_IF_ERROR(st.WaitPublished(s, p));
    RETURN_IF_ERROR(st.ReadPeer(p, bytes, 0, out + p * bytes, bytes));
  }
  StreamFence();
  st.Consumed(s);
  RETURN_IF_ERROR(st.WaitConsumed(s));
  step_ += 1;
  return absl::OkStatus();
}

absl::Status ShmCollectives::ReduceScatterCma(const core::Tensor& input, const core::Tensor& output,
                                              ReduceOp op, const QueuedOp& call) {
  const int64_t k = output.numel();
  const uint8_t* in = Bytes(input);
  uint8_t* out = Bytes(output);
  const int64_t esize = core::DTypeSize(input.dtype());
  const int64_t in_bytes = input.nbytes();
  const bool streaming = in_bytes >= kStreamingBytes;
  absl::StatusOr<uint8_t*> scratch = CmaScratch();
  if (!scratch.ok()) return scratch.status();
  ShmStepper st(*segment_, rank_, call, options_);
  const uint64_t s = step_;
  st.PublishBuffer(s, in, in_bytes);
  RETURN_IF_ERROR(st.WaitPublished(s, -1));
  RETURN_IF_ERROR(ReduceFromPeersCma(st, input.dtype(), op, in, in_bytes, rank_ * k * esize, k, out,
                                     *scratch, streaming));
  StreamFence();
  st.Consumed(s);
  RETURN_IF_ERROR(st.WaitConsumed(s));
  step_ += 1;
  return absl::OkStatus();
}

absl::Status ShmCollectives::AllReduceCma(const core::Tensor& tensor, ReduceOp op,
                                          const QueuedOp& call) {
  const int n = size_;
  const int64_t m = tensor.numel();
  uint8_t* t = Bytes(tensor);
  const int64_t esize = core::DTypeSize(tensor.dtype());
  const int64_t t_bytes = tensor.nbytes();
  const ChunkSplit split(m, n);
  const auto begin = [&](int q) { return split.begin(q); };
  const auto count = [&](int q) { return split.count(q); };
  const bool streaming = t_bytes >= kStreamingBytes;
  absl::StatusOr<uint8_t*> scratch = CmaScratch();
  if (!scratch.ok()) return scratch.status();
  ShmStepper st(*segment_, rank_, call, options_);
  const uint64_t s = step_;
  // Reduce-scatter of the own chunk, in place (peers read only their own chunks of it).
  st.PublishBuffer(s, t, t_bytes);
  RETURN_IF_ERROR(st.WaitPublished(s, -1));
  const int64_t at = begin(rank_) * esize;
  RETURN_IF_ERROR(ReduceFromPeersCma(st, tensor.dtype(), op, t, t_bytes, at, count(rank_), t + at,
                                     *scratch, streaming));
  StreamFence();  // the reduced chunk is read by the peers next
  // All-gather: step s + 1 says this rank's chunk is final and that it has finished
  // reading the peers' chunks, so a peer may overwrite them once it sees it.
  st.Publish(s + 1);
  for (int d = 1; d < n; ++d) {
    const int p = (rank_ + d) % n;
    RETURN_IF_ERROR(st.WaitPublished(s + 1, p));
    const int64_t at = begin(p) * esize;
    RETURN_IF_ERROR(st.ReadPeer(p, t_bytes, at, t + at, count(p) * esize));
  }
  st.Consumed(s + 1);
  RETURN_IF_ERROR(st.WaitConsumed(s + 1));
  step_ += 2;
  return absl::OkStatus();
}

absl::Status ShmCollectives::BroadcastCma(const core::Tensor& tensor, int root,
                                          const QueuedOp& call) {
  const int64_t bytes = tensor.nbytes();
  uint8_t* t = Bytes(tensor);
  ShmStepper st(*segment_, rank_, call, options_);
  const uint64_t s = step_;
  if (rank_ == root) {
    st.PublishBuffer(s, t, bytes);
    st.Consumed(s);
    RETURN_IF_ERROR(st.WaitConsumed(s));
  } else {
    st.Publish(s);
    RETURN_IF_ERROR(st.WaitPublished(s, root));
    RETURN_IF_ERROR(st.ReadPeer(root, bytes, 0, t, bytes));
    st.Consumed(s);
  }
  step_ += 1;
  return absl::OkStatus();
}

absl::Status ShmCollectives::Barrier(const QueuedOp& call) {
  if (size_ == 1) return absl::OkStatus();
  ShmStepper st(*segment_, rank_, call, options_);
  const uint64_t s = step_;
  st.Publish(s);
  RETURN_IF_ERROR(st.WaitPublished(s, -1));
  st.Consumed(s);
  step_ += 1;
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace comm
