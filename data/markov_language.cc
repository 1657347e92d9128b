#include "data/markov_language.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "core/status_macros.h"

namespace data {
namespace {

constexpr int64_t kMaxContexts = int64_t{1} << 20;
constexpr int64_t kMaxTransitions = int64_t{1} << 24;
constexpr double kMaxPeakedness = 30.0;
// Power iteration stops when successive iterates differ by less than this in L1.
constexpr double kStationaryTolerance = 1e-12;
// Work budget for power iteration (multiply-adds, a few seconds at most).
constexpr int64_t kPowerIterationWork = int64_t{1} << 34;

// Independent random streams forked from the seed.
constexpr uint64_t kTransitionStream = 0;
constexpr uint64_t kSampleStream = 1;

double Uniform53(core::Rng& rng) {
  return static_cast<double>(rng.NextU64() >> 11) * (1.0 / 9007199254740992.0);
}

double Entropy(absl::Span<const double> p) {
  double h = 0;
  for (double x : p) {
    if (x > 0) h -= x * std::log(x);
  }
  return h;
}

absl::Status CheckOptions(const MarkovLanguageOptions& o) {
  auto bad = [](const char* option, auto value, const char* rule) {
    return absl::InvalidArgumentError(absl::StrCat("MarkovLanguage: MarkovLanguageOptions.", option,
                                                   " is ", value, "; it must be ", rule));
  };
  if (o.vocab_size < 2) return bad("vocab_size", o.vocab_size, ">= 2");
  if (o.order < 1) return bad("order", o.order, ">= 1");
  if (o.likely_tokens < 1 || o.likely_tokens > o.vocab_size) {
    return bad("likely_tokens", o.likely_tokens, "in [1, vocab_size]");
  }
  if (!(o.peakedness >= 0 && o.peakedness <= kMaxPeakedness)) {
    return bad("peakedness", o.peakedness, "in [0, 30]");
  }
  return absl::OkStatus();
}

// vocab_size^order, the number of contexts; InvalidArgument when it or the number of
// transition probabilities, vocab_size^(order+1), is over its limit.
absl::StatusOr<int64_t> CountContexts(const MarkovLanguageOptions& options) {
  const int64_t v = options.vocab_size;
  const int k = options.order;
  int64_t contexts = 1;
  for (int i = 0; i < k; ++i) {
    contexts *= v;
    if (contexts > kMaxContexts) {
      return absl::InvalidArgumentError(
          absl::StrCat("MarkovLanguage: vocab_size^order = ", v, "^", k,
                       " contexts exceeds 2^20; lower MarkovLanguageOptions.vocab_size or order"));
    }
  }
  if (contexts * v > kMaxTransitions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MarkovLanguage: vocab_size^(order+1) = ", v, "^", k + 1, " = ", contexts * v,
        " transition probabilities exceeds 2^24; lower MarkovLanguageOptions.vocab_size or "
        "order"));
  }
  return contexts;
}

// P(x | c) for each of the `contexts` contexts, [contexts, V] row-major: likely_tokens
// tokens of each row get `peakedness` added to their standard normal logits.
std::vector<double> TransitionProbabilities(const MarkovLanguageOptions& options,
                                            int64_t contexts) {
  const int64_t v = options.vocab_size;
  // Transitions: row c from its own stream, so rows do not depend on each other.
  std::vector<double> probs(contexts * v);
  const core::Rng transitions(core::Rng(options.seed).Fork(kTransitionStream));
  std::vector<int64_t> perm(v);
  std::vector<double> logits(v);
  for (int64_t c = 0; c < contexts; ++c) {
    core::Rng rng = transitions.Fork(static_cast<uint64_t>(c));
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = 0; i < options.likely_tokens; ++i) {  // partial Fisher-Yates
      std::swap(perm[i], perm[i + static_cast<int64_t>(rng.UniformInt(v - i))]);
    }
    for (int64_t j = 0; j < v; ++j) logits[j] = rng.Normal(0.0f, 1.0f);
    for (int64_t i = 0; i < options.likely_tokens; ++i) logits[perm[i]] += options.peakedness;
    const double max_logit = *std::max_element(logits.begin(), logits.end());
    double total = 0;
    double* row = &probs[c * v];
    for (int64_t j = 0; j < v; ++j) total += row[j] = std::exp(logits[j] - max_logit);
    for (int64_t j = 0; j < v; ++j) row[j] /= total;
  }
  return probs;
}

// The chain's stationary distribution over the `contexts` contexts of the transitions
// `probs` over `v` tokens. InternalError when power iteration does not converge.
absl::StatusOr<std::vector<double>> FindStationaryDistribution(const std::vector<double>& probs,
                                                               int64_t contexts, int64_t v) {
  // Stationary distribution over contexts by power iteration: context c = (x_1..x_k)
  // moves to (x_2..x_k, x) with probability P(x | c). Every P(x | c) > 0, so the chain is
  // irreducible and aperiodic and the iteration converges from any start.
  const int64_t shift = contexts / v;  // V^(k-1)
  std::vector<double> pi(contexts, 1.0 / static_cast<double>(contexts));
  std::vector<double> next(contexts);
  const int64_t max_iterations = std::max<int64_t>(1000, kPowerIterationWork / (contexts * v));
  bool converged = false;
  for (int64_t it = 0; it < max_iterations && !converged; ++it) {
    std::fill(next.begin(), next.end(), 0.0);
    for (int64_t c = 0; c < contexts; ++c) {
      const double mass = pi[c];
      const double* row = &probs[c * v];
      double* dst = &next[(c % shift) * v];
      for (int64_t x = 0; x < v; ++x) dst[x] += mass * row[x];
    }
    const double total = std::accumulate(next.begin(), next.end(), 0.0);
    double diff = 0;
    for (int64_t c = 0; c < contexts; ++c) {
      next[c] /= total;
      diff += std::fabs(next[c] - pi[c]);
    }
    pi.swap(next);
    converged = diff < kStationaryTolerance;
  }
  if (!converged) {
    return absl::InternalError(
        absl::StrCat("MarkovLanguage: the stationary distribution did not converge to ",
                     kStationaryTolerance, " within ", max_iterations,
                     " power iterations; the chain mixes "
                     "too slowly (lower MarkovLanguageOptions.peakedness or raise likely_tokens)"));
  }
  return pi;
}

// The entropy rate: each context's next-token entropy, weighted by `stationary`.
double ComputeEntropyRate(const std::vector<double>& probs, const std::vector<double>& stationary,
                          int64_t v) {
  double rate = 0;
  for (size_t c = 0; c < stationary.size(); ++c) {
    rate += stationary[c] * Entropy(absl::MakeConstSpan(&probs[c * v], v));
  }
  return rate;
}

// H(x_0..x_{m-1}) under `stationary` for m = 0..k, in a language of order k over `v`
// tokens.
std::vector<double> PrefixEntropies(const std::vector<double>& stationary, int64_t v, int k) {
  const int64_t contexts = static_cast<int64_t>(stationary.size());
  // Entropy of the first m tokens' marginal, m = 0..k: sum the stationary distribution
  // over the last k - m tokens of each context.
  std::vector<double> entropies(k + 1, 0.0);
  int64_t prefixes = 1;
  for (int m = 1; m <= k; ++m) {
    prefixes *= v;
    const int64_t divisor = contexts / prefixes;
    std::vector<double> marginal(prefixes, 0.0);
    for (int64_t c = 0; c < contexts; ++c) marginal[c / divisor] += stationary[c];
    entropies[m] = Entropy(marginal);
  }
  return entropies;
}

}  // namespace

absl::StatusOr<MarkovLanguage> MarkovLanguage::Create(const MarkovLanguageOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  ASSIGN_OR_RETURN(const int64_t contexts, CountContexts(options));
  const int64_t v = options.vocab_size;
  MarkovLanguage lang;
  lang.options_ = options;
  lang.num_contexts_ = contexts;
  lang.probs_ = TransitionProbabilities(options, contexts);
  ASSIGN_OR_RETURN(lang.stationary_, FindStationaryDistribution(lang.probs_, contexts, v));
  lang.stationary_cdf_.resize(contexts);
  std::partial_sum(lang.stationary_.begin(), lang.stationary_.end(), lang.stationary_cdf_.begin());
  lang.entropy_rate_ = ComputeEntropyRate(lang.probs_, lang.stationary_, v);
  lang.prefix_entropy_ = PrefixEntropies(lang.stationary_, v, options.order);

  const double rate = lang.entropy_rate_;
  const double limit = 0.5 * std::log(static_cast<double>(v));
  if (rate > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("MarkovLanguage: the entropy rate is ", rate,
                     " nats, above half of log(vocab_size) = ", limit,
                     "; the language is too unpredictable for a useful floor. Raise "
                     "MarkovLanguageOptions.peakedness (",
                     options.peakedness, ") or lower likely_tokens (", options.likely_tokens, ")"));
  }
  return lang;
}

absl::StatusOr<absl::Span<const double>> MarkovLanguage::NextTokenProbs(int64_t context) const {
  if (context < 0 || context >= num_contexts_) {
    return absl::InvalidArgumentError(
        absl::StrCat("MarkovLanguage: context ", context, " is outside [0, ", num_contexts_, ")"));
  }
  return absl::MakeConstSpan(&probs_[context * options_.vocab_size], options_.vocab_size);
}

double MarkovLanguage::LossFloor(int seq_len) const {
  if (seq_len < 1) return std::numeric_limits<double>::quiet_NaN();
  // Targets x_1..x_{k-1} see fewer than k tokens: H(x_t | x_<t) = H_{t+1} - H_t, which
  // telescopes; every later target costs the entropy rate.
  const int short_positions = std::min(seq_len, options_.order - 1);
  const double short_total = prefix_entropy_[short_positions + 1] - prefix_entropy_[1];
  return (short_total + static_cast<double>(seq_len - short_positions) * entropy_rate_) /
         static_cast<double>(seq_len);
}

void MarkovLanguage::SampleSequence(int64_t index, int64_t row, int64_t n, int32_t* out) const {
  core::Rng rng = core::Rng(options_.seed)
                      .Fork(kSampleStream)
                      .Fork(static_cast<uint64_t>(index))
                      .Fork(static_cast<uint64_t>(row));
  const int64_t v = options_.vocab_size;
  const int k = options_.order;
  // The first k tokens: a context drawn from the stationary distribution.
  const double u = Uniform53(rng) * stationary_cdf_.back();
  int64_t c =
      std::upper_bound(stationary_cdf_.begin(), stationary_cdf_.end(), u) - stationary_cdf_.begin();
  c = std::min(c, num_contexts_ - 1);
  int64_t place = num_contexts_;
  for (int i = 0; i < k; ++i) {
    place /= v;
    if (i < n) out[i] = static_cast<int32_t>((c / place) % v);
  }
  const int64_t shift = num_contexts_ / v;
  for (int64_t t = k; t < n; ++t) {
    const double* p = &probs_[c * v];
    const double r = Uniform53(rng);
    double cumulative = 0;
    int64_t x = v - 1;
    for (int64_t j = 0; j < v; ++j) {
      cumulative += p[j];
      if (r < cumulative) {
        x = j;
        break;
      }
    }
    out[t] = static_cast<int32_t>(x);
    c = (c % shift) * v + x;
  }
}

absl::StatusOr<TokenBatch> MarkovLanguage::Batch(int64_t index, int batch_size, int seq_len) const {
  if (index < 0 || batch_size < 1 || seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("MarkovLanguage::Batch: index ", index, ", batch_size ", batch_size,
                     ", seq_len ", seq_len, "; need index >= 0, batch_size >= 1 and seq_len >= 1"));
  }
  const int64_t b = batch_size;
  const int64_t t = seq_len;
  ASSIGN_OR_RETURN(core::Tensor inputs,
                   core::Tensor::Allocate({b, t}, core::DType::kInt32, core::MemoryTag::kOther));
  ASSIGN_OR_RETURN(core::Tensor targets,
                   core::Tensor::Allocate({b, t}, core::DType::kInt32, core::MemoryTag::kOther));
  std::vector<int32_t> tokens(t + 1);
  int32_t* in = inputs.data<int32_t>();
  int32_t* tg = targets.data<int32_t>();
  for (int64_t r = 0; r < b; ++r) {
    SampleSequence(index, r, t + 1, tokens.data());
    std::copy(tokens.begin(), tokens.end() - 1, in + r * t);
    std::copy(tokens.begin() + 1, tokens.end(), tg + r * t);
  }
  return TokenBatch{std::move(inputs), std::move(targets)};
}

}  // namespace data
