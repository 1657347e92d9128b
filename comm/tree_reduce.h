// Tree reductions: fp32 sums across ranks whose summation order, and so whose bits, do
// not depend on the number of ranks. N ranks give, bit for bit, what one rank gives when
// it sums the same M micro-batches itself in binary-tree order (deterministic mode).
//
//   // Rank r owns micro-batches [r*M/N, (r+1)*M/N) and sums them locally in tree order.
//   comm::TreeAccumulator acc;
//   for (const core::Tensor& g : my_micro_batch_grads) RETURN_IF_ERROR(acc.Add(g));
//   ASSIGN_OR_RETURN(core::Tensor partial, acc.Finish());          // [size * k]
//
//   // Then continue the same tree across ranks (every rank, same order).
//   ASSIGN_OR_RETURN(auto tree, comm::TreeReducer::Create(world, absl::Seconds(60)));
//   core::Tensor shard = core::Tensor::Empty({k});
//   RETURN_IF_ERROR(tree->ReduceScatter(partial, shard));          // chunk rank() of the sum
//
// NOTE [Tree reduction]: with N = 2^L ranks, rank r holding the partial sum S_r of its
// aligned range of micro-batches, the tree sum is the binary tree over the ranks in rank
// order: N = 4 gives ((S0 + S1) + (S2 + S3)), N = 8 gives
// (((S0 + S1) + (S2 + S3)) + ((S4 + S5) + (S6 + S7))). Level j of that tree (j = 0 first)
// adds the sums of ranks that differ in bit j only, so TreeReducer runs one exchange per
// level between rank r and its partner r XOR 2^j, in a 2-rank subgroup {min, max} made
// at Create: the distance doubles at each level. A 2-rank sum is exactly a + b, and fp
// addition is commutative, so both partners (and every backend: gloo, shm, NCCL) get the
// same bits, whichever of them adds.
// - ReduceScatter (recursive halving): at each level the pair reduce-scatters its live
//   region, the lower rank keeping the first half of the sum, the higher the second half.
//   After all levels rank r holds the region at position bitreverse(r), so the input's N
//   chunks are first permuted into bit-reversed order (chunk c moves to position
//   bitreverse(c), in place: `input` is scratch), and rank r ends with chunk r, exactly
//   the layout of ProcessGroup::ReduceScatter.
// - AllReduce: one 2-rank all-reduce of the whole tensor per level (no scattering): any
//   numel, no padding or scratch, and the same primitive the hybrid form needs.
// - Hybrid sharding (shard groups of H = 2^h consecutive ranks, replicated across groups):
//   levels 0..h-1 pair ranks inside a shard group and levels h..L-1 pair ranks with the
//   same index in different groups, so ReduceScatter(input, output, /*scatter_levels=*/h)
//   scatters over the first h levels and all-reduces over the rest: rank r gets chunk
//   r mod H of the full tree sum over all N ranks, as a reduce-scatter inside the shard
//   group followed by an all-reduce across groups would, with the tree's bits.
// Cost per call (NOTE [Byte counters], S = input bytes): ReduceScatter makes L 2-rank
// reduce-scatters moving S/2 + S/4 + ... = S(N-1)/N per rank, like a plain one; AllReduce
// makes L 2-rank all-reduces of S each, S*L per rank against 2S(N-1)/N for a plain one.
//
// Every rank of the group must make the same TreeReducer calls with the same sizes in
// the same order (NOTE [Same order on all ranks] in comm/store.h); the pair subgroups
// carry no other traffic. Calls are blocking; one TreeReducer is used by one thread at a
// time.
#ifndef COMM_TREE_REDUCE_H_
#define COMM_TREE_REDUCE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/process_group.h"
#include "core/allocator.h"
#include "core/tensor.h"

namespace comm {

// log2(size) when size is a power of two (1, 2, 4, ...); InvalidArgument naming `size`
// otherwise. The levels of a tree over `size` ranks or terms.
absl::StatusOr<int> TreeLevels(int64_t size);

// Cross-rank sums in the order of NOTE [Tree reduction].
class TreeReducer {
 public:
  // Every rank of `group` calls it, in the same order relative to the group's other
  // NewSubgroup calls: it makes log2(size) subgroups of two ranks (level j pairs rank r
  // with r XOR 2^j), named "<group name>/tree<j>[<lower>,<higher>]", which carry the
  // collectives of later calls with deadline `timeout`. InvalidArgument naming the group
  // and its size when group->size() is not a power of two, or for a null group or a
  // non-positive timeout; a subgroup's error (DeadlineExceeded after `timeout`) otherwise.
  static absl::StatusOr<std::unique_ptr<TreeReducer>> Create(std::shared_ptr<ProcessGroup> group,
                                                             absl::Duration timeout);

  // Tree sum of every rank's `input` (fp32, [H * k], H = 2^scatter_levels), scattered:
  // `output` (fp32, [k], not overlapping `input`) gets chunk (rank mod H), elements
  // [c*k, (c+1)*k), of the sum over all size() ranks. With scatter_levels = levels() (the
  // default overload) H = size(): the layout of ProcessGroup::ReduceScatter with kSum;
  // smaller values are the hybrid form of NOTE [Tree reduction]; 0 is an all-reduce into
  // `output`. `input` is used as scratch and left holding intermediate values. Blocks
  // until done. InvalidArgument naming the group and the sizes for a dtype other than
  // fp32, numels that do not match, an overlap, or scatter_levels outside [0, levels()].
  absl::Status ReduceScatter(const core::Tensor& input, const core::Tensor& output);
  absl::Status ReduceScatter(const core::Tensor& input, const core::Tensor& output,
                             int scatter_levels);

  // Tree sum of every rank's `tensor` (fp32, any numel), in place, identical on every
  // rank. Blocks until done. InvalidArgument naming the group for a dtype other than fp32.
  absl::Status AllReduce(const core::Tensor& tensor);

  // log2(group size): the tree's levels, and the number of pair subgroups.
  int levels() const { return static_cast<int>(pairs_.size()); }
  const ProcessGroup& group() const { return *group_; }
  // The byte counters of the pair subgroups added together (NOTE [Byte counters]): what
  // this rank's tree reductions moved. The parent group's own Stats() does not see them.
  CommStats Stats() const;

 private:
  TreeReducer(std::shared_ptr<ProcessGroup> group, absl::Duration timeout,
              std::vector<std::shared_ptr<ProcessGroup>> pairs);

  // 2-rank all-reduces of `tensor` over levels [from_level, levels()).
  absl::Status AllReduceLevels(const core::Tensor& tensor, int from_level);

  std::shared_ptr<ProcessGroup> group_;
  absl::Duration timeout_;
  // pairs_[j]: this rank and rank() XOR 2^j, the lower one first.
  std::vector<std::shared_ptr<ProcessGroup>> pairs_;
};

// Local sum of a power-of-two count of equal-numel fp32 CPU tensors in binary-tree order:
// x0; (x0 + x1); ((x0 + x1) + (x2 + x3)); ... the same tree as NOTE [Tree reduction],
// so a rank's micro-batches and the ranks' partial sums are added by one definition.
// Partial sums wait on a stack like the digits of a binary counter (level i holds the
// sum of 2^i terms), so at most max(1, log2(count)) buffers are alive; a term is copied,
// never kept.
//
//   comm::TreeAccumulator acc;
//   for (const core::Tensor& g : grads) RETURN_IF_ERROR(acc.Add(g));
//   ASSIGN_OR_RETURN(core::Tensor sum, acc.Finish());
class TreeAccumulator {
 public:
  // Buffers are allocated on the CPU under `tag`.
  explicit TreeAccumulator(core::MemoryTag tag = core::MemoryTag::kGrad) : tag_(tag) {}

  // Adds the next term. InvalidArgument (nothing added) for a tensor that is not fp32 on
  // the CPU, or whose numel differs from the first term's; allocation errors as
  // core::Tensor::Allocate.
  absl::Status Add(const core::Tensor& term);

  // Terms added since construction or the last Finish.
  int64_t count() const { return count_; }

  // The tree sum of the terms (shape of the first term, a tensor of its own) and starts
  // over. FailedPrecondition naming the count, and nothing changes, unless count() is a
  // power of two (1, 2, 4, ...).
  absl::StatusOr<core::Tensor> Finish();

 private:
  core::MemoryTag tag_;
  int64_t count_ = 0;
  core::Shape shape_;
  // levels_[i]: the sum of the 2^i terms that wait at level i, undefined when none do.
  std::vector<core::Tensor> levels_;
  // Buffers freed by merges, reused by later terms.
  std::vector<core::Tensor> spare_;
};

}  // namespace comm

#endif  // COMM_TREE_REDUCE_H_
