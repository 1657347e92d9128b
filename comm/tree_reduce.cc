#include "comm/tree_reduce.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/status_macros.h"

namespace comm {
namespace {

std::string Desc(const core::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  return absl::StrCat(t.numel(), " ", core::DTypeName(t.dtype()), " elements ",
                      core::ShapeToString(t.shape()), " on ", t.device().ToString());
}

absl::Status Invalid(absl::string_view op, const ProcessGroup& group, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("TreeReducer::", op, " on ", group.Describe(), ": ", what));
}

bool Overlap(const core::Tensor& a, const core::Tensor& b) {
  if (!a.SharesStorage(b) || a.numel() == 0 || b.numel() == 0) return false;
  return a.offset() < b.offset() + b.numel() && b.offset() < a.offset() + a.numel();
}

// `c` with its lowest `bits` bits in reverse order.
int64_t BitReverse(int64_t c, int bits) {
  int64_t r = 0;
  for (int i = 0; i < bits; ++i) r |= ((c >> i) & 1) << (bits - 1 - i);
  return r;
}

// Runs a collective to completion.
absl::Status Finish(absl::StatusOr<std::shared_ptr<Work>> work, absl::Duration timeout) {
  if (!work.ok()) return work.status();
  return (*work)->Wait(timeout);
}

// Moves chunk c of `t` ([chunks * k]) to position BitReverse(c): swaps of chunk pairs
// through one chunk-sized buffer (the permutation is its own inverse).
absl::Status BitReversePermute(const core::Tensor& t, int bits, int64_t k) {
  const int64_t chunks = int64_t{1} << bits;
  if (bits < 2 || k == 0) return absl::OkStatus();  // the identity
  ASSIGN_OR_RETURN(core::Tensor tmp,
                   core::Tensor::Allocate({k}, t.dtype(), core::MemoryTag::kComm, t.device()));
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = BitReverse(c, bits);
    if (b <= c) continue;
    ASSIGN_OR_RETURN(core::Tensor x, t.View(c * k, {k}));
    ASSIGN_OR_RETURN(core::Tensor y, t.View(b * k, {k}));
    RETURN_IF_ERROR(tmp.CopyFrom(x));
    RETURN_IF_ERROR(x.CopyFrom(y));
    RETURN_IF_ERROR(y.CopyFrom(tmp));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> TreeLevels(int64_t size) {
  if (size < 1 || (size & (size - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a tree needs a power-of-two size (1, 2, 4, ...), got ", size));
  }
  int levels = 0;
  while ((int64_t{1} << levels) < size) ++levels;
  return levels;
}

TreeReducer::TreeReducer(std::shared_ptr<ProcessGroup> group, absl::Duration timeout,
                         std::vector<std::shared_ptr<ProcessGroup>> pairs)
    : group_(std::move(group)), timeout_(timeout), pairs_(std::move(pairs)) {}

absl::StatusOr<std::unique_ptr<TreeReducer>> TreeReducer::Create(
    std::shared_ptr<ProcessGroup> group, absl::Duration timeout) {
  if (group == nullptr) return absl::InvalidArgumentError("TreeReducer::Create: null group");
  if (timeout <= absl::ZeroDuration()) {
    return Invalid("Create", *group,
                   absl::StrCat("timeout must be positive, got ", absl::FormatDuration(timeout)));
  }
  absl::StatusOr<int> levels = TreeLevels(group->size());
  if (!levels.ok()) {
    return Invalid("Create", *group,
                   absl::StrCat("group size ", group->size(),
                                " is not a power of two (1, 2, 4, ...): a binary tree over the "
                                "ranks needs one"));
  }
  const int n = group->size();
  const int rank = group->rank();
  std::vector<std::shared_ptr<ProcessGroup>> pairs;
  for (int j = 0; j < *levels; ++j) {
    // Every rank joins the calls for every pair of the level (NewSubgroup's contract);
    // NotFound for the pairs it is not in.
    const int bit = 1 << j;
    for (int lower = 0; lower < n; ++lower) {
      if ((lower & bit) != 0) continue;
      const int higher = lower | bit;
      SubgroupOptions options;
      options.name = absl::StrCat(group->name(), "/tree", j, "[", lower, ",", higher, "]");
      options.timeout = timeout;
      absl::StatusOr<std::shared_ptr<ProcessGroup>> pair =
          group->NewSubgroup({lower, higher}, options);
      const bool member = rank == lower || rank == higher;
      if (!member) {
        if (pair.status().code() == absl::StatusCode::kNotFound) continue;
        if (pair.ok()) {
          return absl::InternalError(absl::StrCat(
              "TreeReducer::Create on ", group->Describe(), ": NewSubgroup([", lower, ", ", higher,
              "]) returned a group to rank ", rank, ", which is not in it"));
        }
      }
      if (!pair.ok()) return pair.status();
      pairs.push_back(*std::move(pair));
    }
  }
  return std::unique_ptr<TreeReducer>(new TreeReducer(std::move(group), timeout, std::move(pairs)));
}

absl::Status TreeReducer::ReduceScatter(const core::Tensor& input, const core::Tensor& output) {
  return ReduceScatter(input, output, levels());
}

absl::Status TreeReducer::ReduceScatter(const core::Tensor& input, const core::Tensor& output,
                                        int scatter_levels) {
  constexpr absl::string_view kOp = "ReduceScatter";
  if (scatter_levels < 0 || scatter_levels > levels()) {
    return Invalid(
        kOp, *group_,
        absl::StrCat("scatter_levels ", scatter_levels, " is outside [0, ", levels(),
                     "] (the tree over ", group_->size(), " ranks has ", levels(), " levels)"));
  }
  if (!input.defined() || !output.defined() || input.dtype() != core::DType::kFloat32 ||
      output.dtype() != core::DType::kFloat32) {
    return Invalid(kOp, *group_,
                   absl::StrCat("input and output must be fp32 tensors; input is ", Desc(input),
                                ", output is ", Desc(output)));
  }
  const int64_t chunks = int64_t{1} << scatter_levels;
  const int64_t k = output.numel();
  if (input.numel() / chunks != k || input.numel() % chunks != 0) {
    return Invalid(kOp, *group_,
                   absl::StrCat("input has ", input.numel(), " elements but must have ", chunks,
                                " chunks (2^scatter_levels, scatter_levels ", scatter_levels,
                                ") of the output's ", k));
  }
  if (Overlap(input, output)) {
    return Invalid(kOp, *group_,
                   absl::StrCat("output (", Desc(output), ") overlaps input (", Desc(input), ")"));
  }

  // NOTE [Tree reduction]: rank r ends with the region at position bitreverse(r mod H),
  // which the permutation fills with chunk r mod H.
  const core::Tensor in = input.Flat();
  const core::Tensor out = output.Flat();
  RETURN_IF_ERROR(BitReversePermute(in, scatter_levels, k));
  const int rank = group_->rank();
  int64_t offset = 0;
  int64_t length = in.numel();
  for (int j = 0; j < scatter_levels; ++j) {
    const int64_t half = length / 2;
    const int64_t mine = offset + ((rank >> j) & 1) * half;  // the lower rank keeps the first
    ASSIGN_OR_RETURN(core::Tensor region, in.View(offset, {length}));
    core::Tensor dst = out;
    if (j + 1 < scatter_levels) {
      ASSIGN_OR_RETURN(dst, in.View(mine, {half}));  // in place: its own chunk of region
    }
    ReduceScatterOptions options;
    options.reduce_op = ReduceOp::kSum;
    options.timeout = timeout_;
    RETURN_IF_ERROR(Finish(pairs_[j]->ReduceScatter(region, dst, options), timeout_));
    offset = mine;
    length = half;
  }
  if (scatter_levels == 0) RETURN_IF_ERROR(out.CopyFrom(in));
  return AllReduceLevels(out, scatter_levels);
}

absl::Status TreeReducer::AllReduce(const core::Tensor& tensor) {
  if (!tensor.defined() || tensor.dtype() != core::DType::kFloat32) {
    return Invalid("AllReduce", *group_,
                   absl::StrCat("the tensor must be fp32; it is ", Desc(tensor)));
  }
  return AllReduceLevels(tensor, 0);
}

absl::Status TreeReducer::AllReduceLevels(const core::Tensor& tensor, int from_level) {
  for (int j = from_level; j < levels(); ++j) {
    AllReduceOptions options;
    options.reduce_op = ReduceOp::kSum;
    options.timeout = timeout_;
    RETURN_IF_ERROR(Finish(pairs_[j]->AllReduce(tensor, options), timeout_));
  }
  return absl::OkStatus();
}

CommStats TreeReducer::Stats() const {
  CommStats total;
  for (const std::shared_ptr<ProcessGroup>& pair : pairs_) {
    const CommStats s = pair->Stats();
    for (int i = 0; i < kNumCollectiveKinds; ++i) {
      total.by_kind[i].calls += s.by_kind[i].calls;
      total.by_kind[i].bytes_sent += s.by_kind[i].bytes_sent;
      total.by_kind[i].bytes_received += s.by_kind[i].bytes_received;
    }
  }
  return total;
}

absl::Status TreeAccumulator::Add(const core::Tensor& term) {
  if (!term.defined() || term.dtype() != core::DType::kFloat32 || !term.device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TreeAccumulator::Add: terms must be fp32 tensors on the CPU; term ", count_,
                     " is ", Desc(term)));
  }
  if (count_ > 0 && term.numel() != core::NumElements(shape_)) {
    return absl::InvalidArgumentError(absl::StrCat("TreeAccumulator::Add: term ", count_, " has ",
                                                   term.numel(), " elements but the first had ",
                                                   core::NumElements(shape_), " ",
                                                   core::ShapeToString(shape_)));
  }
  if (count_ == 0) shape_ = term.shape();
  const int64_t n = term.numel();
  // The carry: the sum of 2^i terms about to land at level i.
  core::Tensor carry;
  if (!levels_.empty() && levels_[0].defined()) {
    float* a = levels_[0].data<float>();
    const float* b = term.data<float>();
    for (int64_t e = 0; e < n; ++e) a[e] = a[e] + b[e];  // earlier + later
    carry = std::move(levels_[0]);
    levels_[0] = core::Tensor();
    int i = 1;
    for (; i < static_cast<int>(levels_.size()) && levels_[i].defined(); ++i) {
      float* x = levels_[i].data<float>();
      const float* y = carry.data<float>();
      for (int64_t e = 0; e < n; ++e) x[e] = x[e] + y[e];
      spare_.push_back(std::move(carry));
      carry = std::move(levels_[i]);
      levels_[i] = core::Tensor();
    }
    if (i == static_cast<int>(levels_.size())) levels_.emplace_back();
    levels_[i] = std::move(carry);
  } else {
    if (spare_.empty()) {
      ASSIGN_OR_RETURN(carry, core::Tensor::Allocate({n}, core::DType::kFloat32, tag_));
    } else {
      carry = std::move(spare_.back());
      spare_.pop_back();
    }
    RETURN_IF_ERROR(carry.CopyFrom(term));
    if (levels_.empty()) levels_.emplace_back();
    levels_[0] = std::move(carry);
  }
  ++count_;
  return absl::OkStatus();
}

absl::StatusOr<core::Tensor> TreeAccumulator::Finish() {
  if (count_ < 1 || (count_ & (count_ - 1)) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("TreeAccumulator::Finish: ", count_,
                     " terms were added; a binary tree needs a power-of-two count (1, 2, 4, ...)"));
  }
  core::Tensor sum = std::move(levels_.back());
  levels_.clear();
  spare_.clear();
  count_ = 0;
  return sum.Reshape(shape_);
}

}  // namespace comm
