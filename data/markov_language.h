// MarkovLanguage: a synthetic language whose best achievable loss is known exactly.
//
// Tokens come from a seeded random Markov chain of order k over a vocabulary of V
// tokens: the next token depends on the previous k. Each of the V^k contexts has a few
// likely next tokens, so the chain is predictable and its entropy rate sits well below
// log V. Trainers report LossFloor(seq_len) next to their loss: a model that has learnt
// the language reaches it, and none can go below it in expectation.
//
//   data::MarkovLanguageOptions options;
//   options.vocab_size = 64;
//   options.order = 2;
//   options.seed = 7;
//   ASSIGN_OR_RETURN(data::MarkovLanguage language, data::MarkovLanguage::Create(options));
//   ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(/*index=*/step, 32, 128));
//   double floor = language.LossFloor(128);  // nats per token
//
// Contexts are numbered oldest token first: tokens (x_1, ..., x_k) are context
// x_1 V^(k-1) + x_2 V^(k-2) + ... + x_k.
#ifndef DATA_MARKOV_LANGUAGE_H_
#define DATA_MARKOV_LANGUAGE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/tensor.h"

namespace data {

struct MarkovLanguageOptions {
  int vocab_size = 64;  // V >= 2
  int order = 1;        // k >= 1; V^k <= 2^20 and V^(k+1) <= 2^24
  uint64_t seed = 0;
  // Each context favours `likely_tokens` distinct next tokens (chosen at random): their
  // logits are `peakedness` + N(0, 1), the others' N(0, 1). 1 <= likely_tokens <= V.
  int likely_tokens = 4;
  // >= 0. Larger is more predictable; Create rejects values that leave the entropy rate
  // above half of log V.
  double peakedness = 6.0;
};

// A batch of B sequences of T tokens (int32 [B, T]); targets[b][t] is the token after
// inputs[b][t], so each row comes from one sampled sequence of T + 1 tokens.
struct TokenBatch {
  core::Tensor inputs;
  core::Tensor targets;
};

class MarkovLanguage {
 public:
  // Builds the chain and its stationary distribution. InvalidArgument naming the option
  // for an option out of range, for V^k > 2^20 contexts or V^(k+1) > 2^24 transition
  // probabilities, or when the entropy rate exceeds 0.5 log V (raise peakedness or lower
  // likely_tokens); Internal if the stationary distribution does not converge.
  static absl::StatusOr<MarkovLanguage> Create(const MarkovLanguageOptions& options);

  const MarkovLanguageOptions& options() const { return options_; }
  int vocab_size() const { return options_.vocab_size; }
  int order() const { return options_.order; }
  // V^k.
  int64_t num_contexts() const { return num_contexts_; }

  // P(next token = j | context), j = 0..V-1. InvalidArgument for a context outside
  // [0, num_contexts()).
  absl::StatusOr<absl::Span<const double>> NextTokenProbs(int64_t context) const;

  // The stationary distribution over contexts (sums to 1; converged to 1e-12 in L1).
  // The first k tokens of every sampled sequence are drawn from it.
  absl::Span<const double> StationaryDistribution() const { return stationary_; }

  // The entropy rate in nats per token: sum over contexts c of pi(c) H(P(. | c)).
  double EntropyRate() const { return entropy_rate_; }

  // The minimum expected cross-entropy (nats, averaged over the seq_len target positions)
  // of any model that predicts each target of a Batch() row from all tokens before it:
  // position t (target x_t, t = 1..seq_len) costs H(x_t | x_0..x_{t-1}), which is
  // EntropyRate() once t >= k and, for t < k, is computed exactly from the marginals of
  // the stationary distribution. Equals EntropyRate() for k = 1. NaN for seq_len < 1.
  double LossFloor(int seq_len) const;

  // Batch number `index` (>= 0): B = batch_size rows of T = seq_len tokens, int32 on the
  // CPU. Row r is an independent draw determined by (seed, index, r) alone, so the same
  // index gives the same batch on every rank and in any call order, and the first rows
  // of a larger batch are the rows of a smaller one. InvalidArgument for index < 0,
  // batch_size < 1 or seq_len < 1.
  absl::StatusOr<TokenBatch> Batch(int64_t index, int batch_size, int seq_len) const;

 private:
  MarkovLanguage() = default;

  // Writes n tokens of the sequence for (index, row) into `out`.
  void SampleSequence(int64_t index, int64_t row, int64_t n, int32_t* out) const;

  MarkovLanguageOptions options_;
  int64_t num_contexts_ = 0;
  std::vector<double> probs_;           // [num_contexts, V], row-major
  std::vector<double> stationary_;      // [num_contexts]
  std::vector<double> stationary_cdf_;  // running sum of stationary_
  std::vector<double> prefix_entropy_;  // [k + 1]: H(x_0..x_{m-1}) under stationary_
  double entropy_rate_ = 0;
};

}  // namespace data

#endif  // DATA_MARKOV_LANGUAGE_H_
