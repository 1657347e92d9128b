#include "data/token_file.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/sampler.h"
#include "gtest/gtest.h"

namespace data {
namespace {

std::string Dir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/token_file_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void WriteBytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
void Append(std::vector<char>* out, T v) {
  const char* p = reinterpret_cast<const char*>(&v);
  out->insert(out->end(), p, p + sizeof(T));
}

// llm.c's layout: 256 int32 of header, then the tokens (uint16 for magic 20240520 version 1,
// uint32 for 20240801 version 7).
std::vector<char> Llmc(const std::vector<uint32_t>& tokens, bool wide, int32_t count = -1) {
  std::vector<char> out;
  std::vector<int32_t> header(256, 0);
  header[0] = wide ? 20240801 : 20240520;
  header[1] = wide ? 7 : 1;
  header[2] = count >= 0 ? count : static_cast<int32_t>(tokens.size());
  for (int32_t h : header) Append(&out, h);
  for (uint32_t t : tokens) {
    if (wide) {
      Append(&out, t);
    } else {
      Append(&out, static_cast<uint16_t>(t));
    }
  }
  return out;
}

std::vector<char> Raw16(const std::vector<uint32_t>& tokens) {
  std::vector<char> out;
  for (uint32_t t : tokens) Append(&out, static_cast<uint16_t>(t));
  return out;
}

std::vector<uint32_t> Ramp(int n, uint32_t from) {
  std::vector<uint32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = from + static_cast<uint32_t>(i);
  return v;
}

// Every row is a window of consecutive stream tokens: targets are inputs shifted by one.
void ExpectWindows(const TokenBatch& batch, int64_t t) {
  const std::vector<float> in = batch.inputs.ToVector(), tg = batch.targets.ToVector();
  for (int64_t r = 0; r < batch.inputs.size(0); ++r) {
    for (int64_t j = 0; j + 1 < t; ++j) EXPECT_EQ(tg[r * t + j], in[r * t + j + 1]);
    EXPECT_EQ(tg[r * t + t - 1], in[r * t + t - 1] + 1);  // ramps: the next token is +1
  }
}

TEST(TokenFileTest, ReadsLlmcUint16Uint32AndNanoGptFilesAsOneStreamInNameOrder) {
  const std::string dir = Dir("layouts");
  WriteBytes(dir + "/a_train.bin", Llmc(Ramp(100, 0), /*wide=*/false));
  WriteBytes(dir + "/b_train.bin", Llmc(Ramp(50, 100), /*wide=*/true));
  WriteBytes(dir + "/c_train.bin", Raw16(Ramp(30, 150)));
  WriteBytes(dir + "/notes.txt", {'x'});
  absl::StatusOr<TokenFile> f = TokenFile::Open(dir);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->num_tokens(), 180);
  ASSERT_EQ(f->Files().size(), 3u);
  EXPECT_EQ(f->Files()[1].second, 50);
  // The stream is 0..179 in order, so every window is a ramp, also across files.
  for (int64_t index : {0, 1, 7, 1000}) {
    absl::StatusOr<TokenBatch> b = f->Batch(index, 8, 16, 180, /*seed=*/3);
    ASSERT_TRUE(b.ok()) << b.status();
    ExpectWindows(*b, 16);
  }
  absl::StatusOr<TokenFile> one = TokenFile::Open(dir + "/c_train.bin");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->num_tokens(), 30);
}

// The global batch of an index is a function of (index, seed) alone: the same bits on
// every call, and the rows each rank takes at N = 1, 2, 4 put together are that batch.
// (A later epoch, index 700 of 8 rows over 124 windows, included.)
TEST(TokenFileTest, BatchesDependOnIndexAndSeedNotOnTheWorldSize) {
  const std::string dir = Dir("sampling");
  WriteBytes(dir + "/t.bin", Llmc(Ramp(4000, 0), false));
  const TokenFile f = TokenFile::Open(dir + "/t.bin").value();
  const TokenBatch a = f.Batch(5, 8, 32, 4000, 1).value();
  const TokenBatch again = f.Batch(5, 8, 32, 4000, 1).value();
  EXPECT_EQ(a.inputs.ToVector(), again.inputs.ToVector());
  EXPECT_NE(a.inputs.ToVector(), f.Batch(6, 8, 32, 4000, 1).value().inputs.ToVector());
  EXPECT_NE(a.inputs.ToVector(), f.Batch(5, 8, 32, 4000, 2).value().inputs.ToVector());
  EXPECT_NE(f.Batch(700, 8, 32, 4000, 1).value().inputs.ToVector(),
            f.Batch(700, 8, 32, 4000, 2).value().inputs.ToVector());
  for (int world : {1, 2, 4}) {
    std::vector<float> joined;
    for (int rank = 0; rank < world; ++rank) {
      const TokenBatch local = RankSampler::Create(rank, world).value().Local(a).value();
      const std::vector<float> rows = local.inputs.ToVector();
      joined.insert(joined.end(), rows.begin(), rows.end());
    }
    EXPECT_EQ(joined, a.inputs.ToVector()) << world;
  }
}

// NOTE [Token windows]: floor((tokens - 1) / T) windows of T + 1 tokens, window w from w T.
TEST(TokenFileTest, WindowsShareOneTokenAndCoverTheStream) {
  const std::string dir = Dir("windows");
  WriteBytes(dir + "/t.bin", Raw16(Ramp(10, 0)));
  const TokenFile f = TokenFile::Open(dir + "/t.bin").value();
  EXPECT_EQ(f.NumWindows(3), 3);  // 0..3, 3..6, 6..9
  EXPECT_EQ(f.NumWindows(4), 2);  // 0..4, 4..8; token 9 is never read
  EXPECT_EQ(f.NumWindows(9), 1);
  EXPECT_EQ(f.NumWindows(10), 0);  // needs 11 tokens
  EXPECT_EQ(f.NumWindows(0), 0);
  // Windows(0, 5, 3): the 3 windows in stream order, then 2 rows of padding.
  const WindowBatch b = f.Windows(0, 5, 3, 10).value();
  EXPECT_EQ(b.real_rows, 3);
  EXPECT_EQ(b.batch.inputs.ToVector(),
            (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(b.batch.targets.ToVector(),
            (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9, -100, -100, -100, -100, -100, -100}));
  EXPECT_EQ(kIgnoreTarget, -100);
  // From window 2 on: one real row. Past the end: padding only, no error.
  EXPECT_EQ(f.Windows(2, 4, 3, 10).value().real_rows, 1);
  const WindowBatch past = f.Windows(7, 2, 3, 10).value();
  EXPECT_EQ(past.real_rows, 0);
  EXPECT_EQ(past.batch.targets.ToVector(), (std::vector<float>(6, -100)));
  EXPECT_EQ(f.Windows(-1, 2, 3, 10).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.Windows(0, 2, 10, 10).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(f.Windows(0, 2, 3, 9).ok());  // windows 0 and 1 end at token 6
  EXPECT_EQ(f.Windows(0, 3, 3, 9).status().code(), absl::StatusCode::kInvalidArgument);  // 9
}

// The window each row of training batches holds, read back from a ramp stream (window w's
// first input is w T).
std::vector<int64_t> WindowsOf(const TokenBatch& batch, int64_t t) {
  std::vector<int64_t> out;
  const std::vector<float> in = batch.inputs.ToVector();
  for (int64_t r = 0; r < batch.inputs.size(0); ++r) {
    out.push_back(static_cast<int64_t>(in[static_cast<size_t>(r * t)]) / t);
  }
  return out;
}

// NOTE [Token windows]: every window exactly once per epoch, each epoch in another order
// (and another seed another order), batches crossing the epochs' boundaries, the order a
// function of the global sample number only: of neither the batch size nor the rank.
TEST(TokenFileTest, TrainingReadsEveryWindowOncePerEpochInAnOrderOfSeedAndEpoch) {
  const std::string dir = Dir("epochs");
  const int t = 4, windows = 37, rows = 8;  // 37 windows: batches straddle the epochs
  WriteBytes(dir + "/t.bin", Llmc(Ramp(windows * t + 1, 0), false));
  const TokenFile f = TokenFile::Open(dir + "/t.bin").value();
  ASSERT_EQ(f.NumWindows(t), windows);
  const int epochs = 3;
  std::vector<int64_t> samples;
  for (int64_t index = 0; static_cast<int64_t>(samples.size()) < epochs * windows; ++index) {
    const TokenBatch b = f.Batch(index, rows, t, 1000, /*seed=*/5).value();
    ExpectWindows(b, t);
    for (int64_t w : WindowsOf(b, t)) samples.push_back(w);
  }
  std::vector<std::vector<int64_t>> orders;
  for (int e = 0; e < epochs; ++e) {
    std::vector<int64_t> order(samples.begin() + e * windows, samples.begin() + (e + 1) * windows);
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(windows);
    for (int w = 0; w < windows; ++w) all[static_cast<size_t>(w)] = w;
    EXPECT_EQ(sorted, all) << "epoch " << e;
    orders.push_back(order);
  }
  EXPECT_NE(orders[0], orders[1]);
  EXPECT_NE(orders[1], orders[2]);
  for (size_t j = 0; j < samples.size(); ++j) {
    EXPECT_EQ(f.TrainingWindow(static_cast<int64_t>(j), t, 5).value(), samples[j]) << j;
  }
  // Another seed: another order from the first epoch on.
  EXPECT_NE(WindowsOf(f.Batch(0, windows, t, 1000, 6).value(), t), orders[0]);
  // Batches of 4 read the same samples as batches of 8: batch 3 of 4 is rows 4..7 of batch 1.
  const std::vector<int64_t> eight = WindowsOf(f.Batch(1, 8, t, 1000, 5).value(), t);
  EXPECT_EQ(WindowsOf(f.Batch(3, 4, t, 1000, 5).value(), t),
            std::vector<int64_t>(eight.begin() + 4, eight.end()));
  // One window: every epoch reads it.
  WriteBytes(dir + "/one.bin", Raw16(Ramp(t + 1, 0)));
  const TokenFile one = TokenFile::Open(dir + "/one.bin").value();
  EXPECT_EQ(WindowsOf(one.Batch(3, 3, t, 1000, 5).value(), t), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(f.TrainingWindow(-1, t, 5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.Batch(int64_t{1} << 61, 8, t, 1000, 5).status().code(),
            absl::StatusCode::kInvalidArgument);  // sample numbers past 2^62
}

TEST(TokenFileTest, BadFilesAndTokensAreNamed) {
  const std::string dir = Dir("bad");
  EXPECT_EQ(TokenFile::Open(dir + "/missing.bin").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(TokenFile::Open(dir).status().code(), absl::StatusCode::kInvalidArgument);  // no .bin

  WriteBytes(dir + "/count.bin", Llmc(Ramp(10, 0), false, /*count=*/11));
  absl::Status s = TokenFile::Open(dir + "/count.bin").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("count.bin': its header counts 11 tokens of 2 bytes but 20 bytes"),
            std::string::npos)
      << s;

  std::vector<char> version = Llmc(Ramp(4, 0), false);
  version[4] = 3;  // version 3
  WriteBytes(dir + "/version.bin", version);
  s = TokenFile::Open(dir + "/version.bin").status();
  EXPECT_NE(s.message().find("version 3, not 1"), std::string::npos) << s;

  WriteBytes(dir + "/odd.bin", {'a', 'b', 'c'});
  s = TokenFile::Open(dir + "/odd.bin").status();
  EXPECT_NE(s.message().find("odd size (3 bytes)"), std::string::npos) << s;

  // Token 70000 (uint32) at token offset 5 of the file, against a vocabulary of 50304.
  std::vector<uint32_t> tokens = Ramp(8, 0);
  tokens[5] = 70000;
  WriteBytes(dir + "/big.bin", Llmc(tokens, /*wide=*/true));
  const TokenFile big = TokenFile::Open(dir + "/big.bin").value();
  s = big.Batch(0, 16, 7, 50304, 0).status();  // windows of 8 = the whole file
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("token 70000 at token offset 5 of '" + dir + "/big.bin'"),
            std::string::npos)
      << s;
  EXPECT_EQ(big.Batch(0, 1, 8, 50304, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

uint64_t FingerprintOf(const std::string& path) {
  absl::StatusOr<TokenFile> f = TokenFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? f->Fingerprint() : 0;
}

// `bytes` pseudo-random bytes (an even count: a nanoGPT file).
std::vector<char> Noise(int64_t bytes, uint32_t seed) {
  std::vector<char> out(static_cast<size_t>(bytes));
  uint32_t x = seed * 2654435761u + 1;
  for (char& c : out) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return out;
}

// NOTE [Token file fingerprint].
TEST(TokenFileTest, FingerprintIsOfTheContentNotThePath) {
  const std::string dir = Dir("fingerprint_same");
  const std::vector<char> bytes = Noise(3 << 20, 1);
  WriteBytes(dir + "/a.bin", bytes);
  WriteBytes(dir + "/copy.bin", bytes);
  WriteBytes(dir + "/other.bin", Noise(3 << 20, 2));
  EXPECT_EQ(FingerprintOf(dir + "/a.bin"), FingerprintOf(dir + "/a.bin"));
  EXPECT_EQ(FingerprintOf(dir + "/a.bin"), FingerprintOf(dir + "/copy.bin"));
  EXPECT_NE(FingerprintOf(dir + "/a.bin"), FingerprintOf(dir + "/other.bin"));
  // Another size with the same leading bytes.
  WriteBytes(dir + "/longer.bin", [&] {
    std::vector<char> v = bytes;
    v.push_back(0);
    v.push_back(0);
    return v;
  }());
  EXPECT_NE(FingerprintOf(dir + "/a.bin"), FingerprintOf(dir + "/longer.bin"));
}

TEST(TokenFileTest, FingerprintCoversTheSampledBlocksOnly) {
  const std::string dir = Dir("fingerprint_blocks");
  const int64_t edge = TokenFile::kFingerprintEdgeBytes;
  const int64_t blocks = TokenFile::kFingerprintBlocks;
  const int64_t size = 4 << 20;  // more than (blocks + 2) * edge: sampled, not whole
  ASSERT_GT(size, (blocks + 2) * edge);
  const std::vector<char> bytes = Noise(size, 3);
  WriteBytes(dir + "/base.bin", bytes);
  const uint64_t base = FingerprintOf(dir + "/base.bin");
  auto flipped = [&](int64_t offset) {
    std::vector<char> v = bytes;
    v[static_cast<size_t>(offset)] ^= 0x01;
    WriteBytes(dir + "/flipped.bin", v);  // rewritten each time: Open hashes it now
    return FingerprintOf(dir + "/flipped.bin");
  };
  const int64_t middle = size - 2 * edge;
  std::vector<int64_t> sampled = {0, edge - 1, size - edge, size - 1};
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t start = edge + middle * (2 * k + 1) / (2 * blocks) - edge / 2;
    sampled.push_back(start);
    sampled.push_back(start + edge - 1);
  }
  for (int64_t offset : sampled) EXPECT_NE(flipped(offset), base) << "byte " << offset;
  // Between the first 64 KiB and the first middle block, and just before the last 64 KiB:
  // not sampled, so the fingerprint stays (it is not a full-content hash).
  const int64_t first_block = edge + middle / (2 * blocks) - edge / 2;
  for (int64_t offset : {edge, first_block - 1, size - edge - 1}) {
    EXPECT_EQ(flipped(offset), base) << "byte " << offset;
  }
  // A small file is hashed whole: its middle byte counts.
  const std::vector<char> small = Noise(2 * edge + 10, 4);
  WriteBytes(dir + "/small.bin", small);
  std::vector<char> small_flipped = small;
  small_flipped[static_cast<size_t>(edge + 5)] ^= 0x01;
  WriteBytes(dir + "/small_flipped.bin", small_flipped);
  EXPECT_NE(FingerprintOf(dir + "/small.bin"), FingerprintOf(dir + "/small_flipped.bin"));
}

TEST(TokenFileTest, FingerprintDependsOnTheOrderOfTheFiles) {
  const std::vector<char> x = Llmc(Ramp(1000, 0), /*wide=*/false);
  const std::vector<char> y = Llmc(Ramp(1000, 7), /*wide=*/false);  // same size
  const std::string xy = Dir("fingerprint_xy"), yx = Dir("fingerprint_yx");
  WriteBytes(xy + "/a.bin", x);
  WriteBytes(xy + "/b.bin", y);
  WriteBytes(yx + "/a.bin", y);
  WriteBytes(yx + "/b.bin", x);
  EXPECT_NE(FingerprintOf(xy), FingerprintOf(yx));
  const std::string again = Dir("fingerprint_xy_again");
  WriteBytes(again + "/1.bin", x);
  WriteBytes(again + "/2.bin", y);
  EXPECT_EQ(FingerprintOf(xy), FingerprintOf(again));
}

}  // namespace
}  // namespace data
