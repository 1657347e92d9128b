// The bodies of a ShmProcessGroup's collectives (comm/shm_process_group.h), run one at
// a time on the group's worker thread: over the segment's slots (NOTE [Shm protocol] in
// comm/internal/shm_segment.cc) or, for large messages when the group agreed on it,
// over cross-memory attach (NOTE [CMA transport] in the .cc).
//
//   ShmCollectives c(std::move(segment), rank, size, options, /*cma=*/false);
//   RETURN_IF_ERROR(c.AllReduce(tensor, ReduceOp::kSum, op));   // op: a QueuedOp
//
// Every rank must run the same collectives in the same order (NOTE [Same order on all
// ranks]); reductions combine the ranks in rank order, so every rank gets the same
// bits, with either transport. Private to the shm_process_group library.
#ifndef COMM_INTERNAL_SHM_COLLECTIVES_H_
#define COMM_INTERNAL_SHM_COLLECTIVES_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/internal/shm_segment.h"
#include "comm/internal/worker_group.h"
#include "comm/process_group.h"
#include "comm/shm_options.h"
#include "core/tensor.h"

namespace comm {
namespace internal {

class ShmCollectives {
 public:
  // `segment` is mapped and this rank's control block initialised (JoinShmSegment);
  // `cma` is the transport every rank agreed on (ChooseShmTransport).
  ShmCollectives(std::unique_ptr<ShmSegment> segment, int rank, int size, const ShmOptions& options,
                 bool cma);

  const ShmSegment& segment() const { return *segment_; }
  // Whether bulk data goes through cross-memory attach.
  bool cma() const { return cma_; }

  // The collectives of comm/process_group.h, for `call` (its description, deadline and
  // timeout). Errors name call.what.
  absl::Status AllGather(const core::Tensor& input, const core::Tensor& output,
                         const QueuedOp& call);
  absl::Status ReduceScatter(const core::Tensor& input, const core::Tensor& output, ReduceOp op,
                             const QueuedOp& call);
  absl::Status AllReduce(const core::Tensor& tensor, ReduceOp op, const QueuedOp& call);
  absl::Status Broadcast(const core::Tensor& tensor, int root, const QueuedOp& call);
  absl::Status Barrier(const QueuedOp& call);

 private:
  // The same collectives over cross-memory attach (NOTE [CMA transport]).
  absl::Status AllGatherCma(const core::Tensor& input, const core::Tensor& output,
                            const QueuedOp& call);
  absl::Status ReduceScatterCma(const core::Tensor& input, const core::Tensor& output, ReduceOp op,
                                const QueuedOp& call);
  absl::Status AllReduceCma(const core::Tensor& tensor, ReduceOp op, const QueuedOp& call);
  absl::Status BroadcastCma(const core::Tensor& tensor, int root, const QueuedOp& call);
  // Reduces `elems` elements at byte `at` of every rank's published buffer (`buf_bytes`
  // long; this rank's is `own`) into `out` in rank order, reading the peers' pieces into
  // `scratch` (CmaScratch); the reduce-scatter part of both CMA reductions.
  absl::Status ReduceFromPeersCma(ShmStepper& st, core::DType dtype, ReduceOp op,
                                  const uint8_t* own, int64_t buf_bytes, int64_t at, int64_t elems,
                                  uint8_t* out, uint8_t* scratch, bool streaming);
  // Whether a collective of `bytes` (the size ShmOptions.cma_min_bytes talks about) uses
  // cross-memory attach; the same on every rank.
  bool UseCma(int64_t bytes) const {
    return cma_ && size_ > 1 && bytes > 0 && bytes >= options_.cma_min_bytes;
  }
  // Scratch of the CMA reduce-scatter: (n - 1) pieces of cma_piece_bytes_.
  absl::StatusOr<uint8_t*> CmaScratch();
  // Reduces `len` elements of `chunks` (rank order) into `out`; with `streaming`, through
  // reduce_scratch_ and non-temporal stores.
  absl::Status ReducePiece(core::DType dtype, ReduceOp op, const void* const* chunks, int64_t len,
                           uint8_t* out, bool streaming);

  const std::unique_ptr<ShmSegment> segment_;
  const int rank_;
  const int size_;
  const ShmOptions options_;
  // Whether bulk data goes through cross-memory attach; agreed in Create, then constant.
  const bool cma_;
  // Bytes of one peer's piece in a CMA reduction (the pieces of all peers fit in L2).
  const int64_t cma_piece_bytes_;
  // Steps this rank has completed (NOTE [Shm protocol]).
  uint64_t step_ = 0;
  // Where large reductions land before they stream out (NOTE [Streaming copies]); one
  // sub-slot, allocated on first use (tag kComm).
  core::Tensor reduce_scratch_;
  core::Tensor cma_scratch_;
};

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_SHM_COLLECTIVES_H_
