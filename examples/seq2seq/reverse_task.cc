#include "examples/seq2seq/reverse_task.h"

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "core/status_macros.h"

namespace seq2seq {
namespace {

// Row `row` of batch `index`'s stream: its first draw is the length.
core::Rng RowRng(uint64_t seed, int64_t index, int64_t row) {
  return core::Rng(seed).Fork(static_cast<uint64_t>(index)).Fork(static_cast<uint64_t>(row));
}

}  // namespace

absl::StatusOr<ReverseTask> ReverseTask::Create(const ReverseTaskOptions& options) {
  if (options.vocab <= kFirstSymbol) {
    return absl::InvalidArgumentError(absl::StrCat("ReverseTaskOptions.vocab is ", options.vocab,
                                                   "; need more than ", kFirstSymbol,
                                                   " (pad, bos and eos come first)"));
  }
  if (options.max_symbols < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReverseTaskOptions.max_symbols is ", options.max_symbols, "; need >= 1"));
  }
  return ReverseTask(options);
}

int64_t ReverseTask::Tokens(int64_t index, int64_t begin, int64_t end) const {
  int64_t tokens = 0;
  for (int64_t r = begin; r < end; ++r) {
    core::Rng rng = RowRng(options_.seed, index, r);
    tokens += 2 + static_cast<int64_t>(rng.UniformInt(options_.max_symbols));
  }
  return tokens;
}

absl::StatusOr<ReverseBatch> ReverseTask::Rows(int64_t index, int64_t begin, int64_t end) const {
  if (begin < 0 || end <= begin) {
    return absl::InvalidArgumentError(absl::StrCat("ReverseTask::Rows: rows [", begin, ", ", end,
                                                   ") of batch ", index,
                                                   "; need 0 <= begin < end"));
  }
  const int64_t rows = end - begin, s = options_.max_symbols, t = s + 1;
  std::vector<int32_t> src(rows * s, kPad), mask(rows * s, 0), tgt(rows * t, kPad),
      labels(rows * t, kIgnore);
  int64_t tokens = 0;
  for (int64_t i = 0; i < rows; ++i) {
    core::Rng rng = RowRng(options_.seed, index, begin + i);
    const int64_t len = 1 + static_cast<int64_t>(rng.UniformInt(s));
    const uint64_t symbols = static_cast<uint64_t>(options_.vocab - kFirstSymbol);
    for (int64_t j = 0; j < len; ++j) {
      src[i * s + j] = kFirstSymbol + static_cast<int32_t>(rng.UniformInt(symbols));
      mask[i * s + j] = 1;
    }
    tgt[i * t] = kBos;
    for (int64_t j = 0; j < len; ++j) {
      const int32_t symbol = src[i * s + len - 1 - j];
      labels[i * t + j] = symbol;
      tgt[i * t + j + 1] = symbol;
    }
    labels[i * t + len] = kEos;
    tokens += len + 1;
  }
  ReverseBatch out;
  ASSIGN_OR_RETURN(out.src, core::Tensor::FromInts(src, {rows, s}));
  ASSIGN_OR_RETURN(out.src_mask, core::Tensor::FromInts(mask, {rows, 1, 1, s}));
  ASSIGN_OR_RETURN(out.tgt, core::Tensor::FromInts(tgt, {rows, t}));
  ASSIGN_OR_RETURN(out.labels, core::Tensor::FromInts(labels, {rows, t}));
  out.tokens = tokens;
  return out;
}

}  // namespace seq2seq
