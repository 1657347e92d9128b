// The copies and reductions of the shm backend's collectives that write their
// destination with non-temporal (streaming) stores on x86 (NOTE [Streaming copies] in
// the .cc); elsewhere plain memcpy and internal::ReduceChunkList.
//
//   const bool streaming = bytes >= kStreamingBytes;
//   CopyOut(dst, slot, len, streaming);
//   ...
//   StreamFence();   // once the collective's stores are done
//
// Private to the shm_process_group library.
#ifndef COMM_INTERNAL_SHM_COPY_H_
#define COMM_INTERNAL_SHM_COPY_H_

#include <cstddef>
#include <cstdint>

#include "comm/process_group.h"

namespace comm {
namespace internal {

// A collective whose largest tensor has at least this many bytes streams its stores.
inline constexpr int64_t kStreamingBytes = int64_t{4} << 20;

// memcpy(dst, src, n), with streaming stores when `streaming` (and n >= 256).
void CopyOut(void* dst, const void* src, size_t n, bool streaming);

// Copies `src` into `slot` (ordinary stores) and into `dst` (streaming or not) in one
// pass over `src`, for an all-gather's own piece.
void CopyTwice(void* slot, void* dst, const void* src, size_t n, bool streaming);

// out[i] = chunks[0][i] op chunks[1][i] op ... (rank order; average divides the sum by
// n) for fp32, with streaming stores: the same operations, in the same order, as
// internal::ReduceChunkList, so the same bits. `out` may be one of the chunks. False
// when it cannot (not x86, or `out` not 16-byte aligned): then the caller goes through
// ReduceChunkList.
bool StreamReduceFloat(ReduceOp op, const void* const* chunks, int n, int64_t len, void* out);

// Ends a collective's streaming stores (they are weakly ordered).
void StreamFence();

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_SHM_COPY_H_
