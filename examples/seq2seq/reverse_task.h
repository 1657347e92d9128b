// The reverse task: variable-length sequences of symbols, padded, and their reversal. Each
// row is a pure function of (seed, batch index, row), so any rank makes exactly the rows it
// runs and every world size sees the same global batches.
//
//   seq2seq::ReverseTask task({.vocab = 16, .max_symbols = 7, .seed = 3});
//   ASSIGN_OR_RETURN(seq2seq::ReverseBatch b, task.Rows(/*index=*/0, /*begin=*/0, /*end=*/8));
//   // b.src [8, 7], b.src_mask [8, 1, 1, 7], b.tgt [8, 8], b.labels [8, 8]
//
// Row r of batch `index`: L symbols drawn uniformly from [kFirstSymbol, vocab), L uniform in
// [1, max_symbols]. src = the symbols, then kPad up to max_symbols; src_mask 1 over the
// symbols, 0 over the padding; tgt = kBos then the symbols reversed, then kPad up to
// max_symbols + 1 (the decoder's inputs); labels = the reversed symbols then kEos, then
// kIgnore (the loss's ignore_index) over the padding: L + 1 real target tokens.
#ifndef EXAMPLES_SEQ2SEQ_REVERSE_TASK_H_
#define EXAMPLES_SEQ2SEQ_REVERSE_TASK_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace seq2seq {

constexpr int32_t kPad = 0;
constexpr int32_t kBos = 1;
constexpr int32_t kEos = 2;
constexpr int32_t kFirstSymbol = 3;
constexpr int32_t kIgnore = -100;

struct ReverseTaskOptions {
  int64_t vocab = 16;       // > kFirstSymbol
  int64_t max_symbols = 7;  // >= 1
  uint64_t seed = 1;
};

struct ReverseBatch {
  core::Tensor src;       // int32 [R, max_symbols]
  core::Tensor src_mask;  // int32 [R, 1, 1, max_symbols]
  core::Tensor tgt;       // int32 [R, max_symbols + 1]
  core::Tensor labels;    // int32 [R, max_symbols + 1]
  int64_t tokens = 0;     // real target tokens (labels not kIgnore)
};

class ReverseTask {
 public:
  // InvalidArgument naming the option when vocab <= kFirstSymbol or max_symbols < 1.
  static absl::StatusOr<ReverseTask> Create(const ReverseTaskOptions& options);

  // Rows [begin, end) of batch `index` (0 <= begin < end). InvalidArgument otherwise.
  absl::StatusOr<ReverseBatch> Rows(int64_t index, int64_t begin, int64_t end) const;
  // The real target tokens of rows [begin, end) of batch `index` (what Rows(...).tokens
  // says, without making the rows).
  int64_t Tokens(int64_t index, int64_t begin, int64_t end) const;

  const ReverseTaskOptions& options() const { return options_; }

 private:
  explicit ReverseTask(const ReverseTaskOptions& options) : options_(options) {}
  ReverseTaskOptions options_;
};

}  // namespace seq2seq

#endif  // EXAMPLES_SEQ2SEQ_REVERSE_TASK_H_
