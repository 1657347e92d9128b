#include "data/markov_language.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <vector>

#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace data {
namespace {

using ::testing::HasSubstr;

MarkovLanguage MakeLanguage(const MarkovLanguageOptions& options) {
  absl::StatusOr<MarkovLanguage> lang = MarkovLanguage::Create(options);
  EXPECT_TRUE(lang.ok()) << lang.status();
  return *std::move(lang);
}

// A small peaked chain: one favoured next token per context. With V = 2 or 3 the N(0, 1)
// noise matters, so the tests below use seeds whose entropy rate is clearly nonzero and
// within Create's limit of 0.5 log V.
MarkovLanguageOptions Tiny(int vocab_size, int order, uint64_t seed) {
  MarkovLanguageOptions o;
  o.vocab_size = vocab_size;
  o.order = order;
  o.seed = seed;
  o.likely_tokens = 1;
  o.peakedness = 4.0;
  return o;
}

double Det(std::vector<std::vector<double>> a) {
  const size_t n = a.size();
  double det = 1;
  for (size_t col = 0; col < n; ++col) {
    size_t pivot = col;
    for (size_t r = col + 1; r < n; ++r) {
      if (std::fabs(a[r][col]) > std::fabs(a[pivot][col])) pivot = r;
    }
    if (a[pivot][col] == 0) return 0;
    if (pivot != col) {
      std::swap(a[pivot], a[col]);
      det = -det;
    }
    det *= a[col][col];
    for (size_t r = col + 1; r < n; ++r) {
      const double f = a[r][col] / a[col][col];
      for (size_t c = col; c < n; ++c) a[r][c] -= f * a[col][c];
    }
  }
  return det;
}

// Stationary distribution of the context chain by the Markov chain tree theorem:
// pi_i is proportional to det((I - P) without row i and column i). Independent of the
// power iteration the implementation uses.
std::vector<double> TreeTheoremStationary(const MarkovLanguage& lang) {
  const int64_t n = lang.num_contexts();
  const int64_t v = lang.vocab_size();
  std::vector<std::vector<double>> i_minus_p(n, std::vector<double>(n, 0.0));
  for (int64_t c = 0; c < n; ++c) {
    i_minus_p[c][c] += 1.0;
    absl::Span<const double> row = lang.NextTokenProbs(c).value();
    for (int64_t x = 0; x < v; ++x) i_minus_p[c][(c % (n / v)) * v + x] -= row[x];
  }
  std::vector<double> pi(n);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<std::vector<double>> minor;
    for (int64_t r = 0; r < n; ++r) {
      if (r == i) continue;
      std::vector<double> row;
      for (int64_t c = 0; c < n; ++c) {
        if (c != i) row.push_back(i_minus_p[r][c]);
      }
      minor.push_back(row);
    }
    pi[i] = Det(minor);
  }
  const double total = std::accumulate(pi.begin(), pi.end(), 0.0);
  for (double& x : pi) x /= total;
  return pi;
}

double RowEntropy(absl::Span<const double> p) {
  double h = 0;
  for (double x : p) h -= x > 0 ? x * std::log(x) : 0;
  return h;
}

// The power iteration converges to 1e-12 in L1, which bounds each probability's error;
// the entropy rate, a pi-weighted average of entropies <= log V, then differs by at most
// 1e-12 * log V plus double rounding (~1e-15), so 1e-10 is a safe bound.
constexpr double kExactTol = 1e-10;

void ExpectStationaryAndRateExact(const MarkovLanguage& lang) {
  const std::vector<double> pi = TreeTheoremStationary(lang);
  absl::Span<const double> got = lang.StationaryDistribution();
  ASSERT_EQ(got.size(), pi.size());
  double rate = 0;
  for (size_t c = 0; c < pi.size(); ++c) {
    EXPECT_NEAR(got[c], pi[c], kExactTol) << "context " << c;
    rate += pi[c] * RowEntropy(lang.NextTokenProbs(c).value());
  }
  EXPECT_NEAR(lang.EntropyRate(), rate, kExactTol);
  EXPECT_GT(lang.EntropyRate(), 0.0);
}

TEST(MarkovLanguageTest, EntropyRateOfAThreeTokenChainMatchesTheTreeTheorem) {
  for (uint64_t seed : {1, 2, 3}) {
    MarkovLanguage lang = MakeLanguage(Tiny(3, 1, seed));
    EXPECT_EQ(lang.num_contexts(), 3);
    ExpectStationaryAndRateExact(lang);
  }
}

TEST(MarkovLanguageTest, EntropyRateOfABinaryOrderTwoChainMatchesTheTreeTheorem) {
  for (uint64_t seed : {1, 2, 3}) {
    MarkovLanguage lang = MakeLanguage(Tiny(2, 2, seed));
    EXPECT_EQ(lang.num_contexts(), 4);
    ExpectStationaryAndRateExact(lang);
  }
}

// Exact expected per-token loss of the Bayes predictor, by enumerating every sequence of
// seq_len + 1 tokens: p(x_t | x_<t) = p(x_0..x_t) / p(x_0..x_{t-1}) from summed sequence
// probabilities, the first k tokens distributed as the stationary contexts.
double BruteForceLossFloor(const MarkovLanguage& lang, int seq_len) {
  const int v = lang.vocab_size();
  const int k = lang.order();
  const int len = std::max(seq_len + 1, k);
  int64_t count = 1;
  for (int i = 0; i < len; ++i) count *= v;
  std::vector<std::vector<int>> seqs;
  std::vector<double> probs;
  std::map<std::vector<int>, double> prefix_prob;
  for (int64_t code = 0; code < count; ++code) {
    std::vector<int> s(len);
    int64_t rest = code;
    for (int i = len - 1; i >= 0; --i) {
      s[i] = static_cast<int>(rest % v);
      rest /= v;
    }
    int64_t ctx = 0;
    for (int i = 0; i < k; ++i) ctx = ctx * v + s[i];
    double p = lang.StationaryDistribution()[ctx];
    for (int t = k; t < len; ++t) {
      p *= lang.NextTokenProbs(ctx).value()[s[t]];
      ctx = (ctx % (lang.num_contexts() / v)) * v + s[t];
    }
    for (int m = 1; m <= len; ++m) prefix_prob[std::vector<int>(s.begin(), s.begin() + m)] += p;
    seqs.push_back(s);
    probs.push_back(p);
  }
  double loss = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (int t = 1; t <= seq_len; ++t) {
      const std::vector<int> upto(seqs[i].begin(), seqs[i].begin() + t + 1);
      const std::vector<int> before(seqs[i].begin(), seqs[i].begin() + t);
      loss -= probs[i] * std::log(prefix_prob[upto] / prefix_prob[before]);
    }
  }
  return loss / seq_len;
}

TEST(MarkovLanguageTest, LossFloorMatchesEnumerationOfAllSequences) {
  struct Case {
    int vocab, order, max_len;
    uint64_t seed;
  };
  for (const Case& c : {Case{3, 1, 3, 3}, Case{2, 2, 5, 2}, Case{3, 3, 4, 0}}) {
    MarkovLanguage lang = MakeLanguage(Tiny(c.vocab, c.order, c.seed));
    for (int t = 1; t <= c.max_len; ++t) {
      // Enumeration sums a few hundred double terms: 1e-10 as above.
      EXPECT_NEAR(lang.LossFloor(t), BruteForceLossFloor(lang, t), kExactTol)
          << "V=" << c.vocab << " k=" << c.order << " seq_len=" << t;
    }
    if (c.order > 1) {
      // Early positions see less context, so short sequences have a higher floor.
      EXPECT_GT(lang.LossFloor(1), lang.EntropyRate() + 1e-3);
    }
  }
}

TEST(MarkovLanguageTest, LossFloorIsTheEntropyRateForOrderOneAndApproachesItAbove) {
  MarkovLanguage first = MakeLanguage(MarkovLanguageOptions());
  for (int t : {1, 2, 17, 256}) EXPECT_DOUBLE_EQ(first.LossFloor(t), first.EntropyRate());
  MarkovLanguageOptions o;
  o.vocab_size = 16;
  o.order = 3;
  MarkovLanguage third = MakeLanguage(o);
  double previous = third.LossFloor(1);
  for (int t = 2; t <= 64; ++t) {
    const double floor = third.LossFloor(t);
    EXPECT_LT(floor, previous) << t;
    EXPECT_GT(floor, third.EntropyRate()) << t;
    previous = floor;
  }
  EXPECT_TRUE(std::isnan(third.LossFloor(0)));
}

TEST(MarkovLanguageTest, FloorIsAtMostHalfOfLogVForDefaultsAndSeveralSeeds) {
  for (int order : {1, 2}) {
    for (uint64_t seed = 0; seed < 5; ++seed) {
      MarkovLanguageOptions o;
      o.order = order;
      o.seed = seed;
      MarkovLanguage lang = MakeLanguage(o);
      const double half_log_v = 0.5 * std::log(64.0);
      EXPECT_LE(lang.EntropyRate(), half_log_v) << "order " << order << " seed " << seed;
      EXPECT_LE(lang.LossFloor(128), half_log_v) << "order " << order << " seed " << seed;
      // Peaked but not trivial: well above zero, so there is something to learn.
      EXPECT_GT(lang.EntropyRate(), 0.1 * half_log_v);
    }
  }
}

// Log-probability of token t of `seq` given the tokens before it, computed in the test
// from the published transitions and stationary distribution.
double TrueLogProb(const MarkovLanguage& lang, const std::vector<int32_t>& seq, int t) {
  const int64_t v = lang.vocab_size();
  const int k = lang.order();
  if (t >= k) {
    int64_t ctx = 0;
    for (int i = t - k; i < t; ++i) ctx = ctx * v + seq[i];
    return std::log(lang.NextTokenProbs(ctx).value()[seq[t]]);
  }
  // Fewer than k tokens before t: ratio of marginals of the stationary contexts.
  auto marginal = [&](int m) {
    double p = 0;
    for (int64_t c = 0; c < lang.num_contexts(); ++c) {
      int64_t rest = c;
      std::vector<int32_t> digits(k);
      for (int i = k - 1; i >= 0; --i) {
        digits[i] = static_cast<int32_t>(rest % v);
        rest /= v;
      }
      if (std::equal(digits.begin(), digits.begin() + m, seq.begin())) {
        p += lang.StationaryDistribution()[c];
      }
    }
    return p;
  };
  return std::log(marginal(t + 1) / marginal(t));
}

// Mean per-token NLL of sampled rows under the true model, and its standard error from
// the spread of the per-row means (rows are independent draws; tokens within a row are
// not, so the row is the unit of the error estimate).
std::pair<double, double> EmpiricalNll(const MarkovLanguage& lang, int rows, int seq_len) {
  const TokenBatch batch = lang.Batch(3, rows, seq_len).value();
  const int32_t* in = batch.inputs.data<int32_t>();
  const int32_t* tg = batch.targets.data<int32_t>();
  std::vector<double> row_means;
  for (int r = 0; r < rows; ++r) {
    std::vector<int32_t> seq(in + r * seq_len, in + (r + 1) * seq_len);
    seq.push_back(tg[(r + 1) * seq_len - 1]);
    double nll = 0;
    for (int t = 1; t <= seq_len; ++t) nll -= TrueLogProb(lang, seq, t);
    row_means.push_back(nll / seq_len);
  }
  const double mean = std::accumulate(row_means.begin(), row_means.end(), 0.0) / rows;
  double var = 0;
  for (double x : row_means) var += (x - mean) * (x - mean);
  var /= rows - 1;
  return {mean, std::sqrt(var / rows)};
}

TEST(MarkovLanguageTest, EmpiricalNllOfSampledSequencesConvergesToTheFloor) {
  // Tolerance: 5 standard errors of the sample mean (a two-sided normal tail of 6e-7;
  // the seed is fixed, so the test is deterministic either way). The standard error is
  // itself checked to be small, so the comparison has teeth.
  {
    MarkovLanguage lang = MakeLanguage(MarkovLanguageOptions());
    const auto [mean, se] = EmpiricalNll(lang, 512, 64);
    EXPECT_LT(se, 0.02);
    EXPECT_NEAR(mean, lang.LossFloor(64), 5 * se);
  }
  {
    // Order 2 with short rows, where the floor sits clearly above the entropy rate: the
    // samples must match the floor, not the rate.
    MarkovLanguageOptions o;
    o.vocab_size = 8;
    o.order = 2;
    o.likely_tokens = 2;
    MarkovLanguage lang = MakeLanguage(o);
    const auto [mean, se] = EmpiricalNll(lang, 20000, 2);
    EXPECT_LT(se, 0.02);
    EXPECT_NEAR(mean, lang.LossFloor(2), 5 * se);
    EXPECT_GT(lang.LossFloor(2) - lang.EntropyRate(), 10 * se);
  }
}

TEST(MarkovLanguageTest, BatchesAreDeterministicInSeedAndIndex) {
  MarkovLanguageOptions o;
  o.order = 2;
  o.seed = 11;
  MarkovLanguage a = MakeLanguage(o);
  MarkovLanguage b = MakeLanguage(o);
  // Different call orders on two instances give the same batches.
  const TokenBatch a5 = a.Batch(5, 4, 16).value();
  const TokenBatch a3 = a.Batch(3, 4, 16).value();
  const TokenBatch b3 = b.Batch(3, 4, 16).value();
  const TokenBatch b5 = b.Batch(5, 4, 16).value();
  EXPECT_EQ(a5.inputs.ToVector(), b5.inputs.ToVector());
  EXPECT_EQ(a5.targets.ToVector(), b5.targets.ToVector());
  EXPECT_EQ(a3.inputs.ToVector(), b3.inputs.ToVector());
  EXPECT_NE(a3.inputs.ToVector(), a5.inputs.ToVector());
  // Rows are independent of the batch size: a larger batch starts with the smaller one.
  const TokenBatch big = a.Batch(5, 8, 16).value();
  const std::vector<float> big_inputs = big.inputs.ToVector();
  EXPECT_EQ(std::vector<float>(big_inputs.begin(), big_inputs.begin() + 4 * 16),
            a5.inputs.ToVector());
  // Rows differ from each other.
  const std::vector<float> rows = a5.inputs.ToVector();
  EXPECT_NE(std::vector<float>(rows.begin(), rows.begin() + 16),
            std::vector<float>(rows.begin() + 16, rows.begin() + 32));
  // Another seed is another language and other samples.
  o.seed = 12;
  EXPECT_NE(MakeLanguage(o).Batch(5, 4, 16).value().inputs.ToVector(), rows);
}

TEST(MarkovLanguageTest, BatchHasShiftedTargetsInTheVocabulary) {
  MarkovLanguage lang = MakeLanguage(MarkovLanguageOptions());
  const TokenBatch batch = lang.Batch(0, 3, 10).value();
  EXPECT_EQ(batch.inputs.dtype(), core::DType::kInt32);
  EXPECT_EQ(batch.targets.dtype(), core::DType::kInt32);
  EXPECT_EQ(batch.inputs.shape(), (core::Shape{3, 10}));
  EXPECT_EQ(batch.targets.shape(), (core::Shape{3, 10}));
  const int32_t* in = batch.inputs.data<int32_t>();
  const int32_t* tg = batch.targets.data<int32_t>();
  for (int r = 0; r < 3; ++r) {
    for (int t = 0; t < 10; ++t) {
      EXPECT_GE(in[r * 10 + t], 0);
      EXPECT_LT(in[r * 10 + t], 64);
      EXPECT_GE(tg[r * 10 + t], 0);
      EXPECT_LT(tg[r * 10 + t], 64);
      if (t + 1 < 10) {
        EXPECT_EQ(tg[r * 10 + t], in[r * 10 + t + 1]) << r << "," << t;
      }
    }
  }
}

TEST(MarkovLanguageTest, RejectsBadOptionsNamingTheOption) {
  struct Case {
    const char* needle;
    MarkovLanguageOptions options;
  };
  auto with = [](auto set) {
    MarkovLanguageOptions o;
    set(o);
    return o;
  };
  const std::vector<Case> cases = {
      {"vocab_size", with([](MarkovLanguageOptions& o) { o.vocab_size = 1; })},
      {"order", with([](MarkovLanguageOptions& o) { o.order = 0; })},
      {"likely_tokens", with([](MarkovLanguageOptions& o) { o.likely_tokens = 0; })},
      {"likely_tokens", with([](MarkovLanguageOptions& o) { o.likely_tokens = 65; })},
      {"peakedness", with([](MarkovLanguageOptions& o) { o.peakedness = -1; })},
      {"peakedness", with([](MarkovLanguageOptions& o) { o.peakedness = std::nan(""); })},
      // 2^21 contexts.
      {"2^20", with([](MarkovLanguageOptions& o) {
         o.vocab_size = 2;
         o.order = 21;
         o.likely_tokens = 1;
       })},
      // 1025^2 > 2^20 contexts.
      {"2^20", with([](MarkovLanguageOptions& o) {
         o.vocab_size = 1025;
         o.order = 2;
       })},
      // 2^20 contexts but 2^30 transition probabilities.
      {"2^24", with([](MarkovLanguageOptions& o) {
         o.vocab_size = 1024;
         o.order = 2;
       })},
      // Flat rows: entropy near log V.
      {"peakedness", with([](MarkovLanguageOptions& o) { o.peakedness = 0; })},
  };
  for (const Case& c : cases) {
    absl::StatusOr<MarkovLanguage> lang = MarkovLanguage::Create(c.options);
    EXPECT_EQ(lang.status().code(), absl::StatusCode::kInvalidArgument) << c.needle;
    EXPECT_THAT(lang.status().message(), HasSubstr(c.needle));
  }
  MarkovLanguage lang = MakeLanguage(MarkovLanguageOptions());
  EXPECT_EQ(lang.Batch(-1, 2, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(lang.Batch(0, 0, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(lang.Batch(0, 2, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(lang.NextTokenProbs(64).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace data
