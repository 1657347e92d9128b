#include "checkpoint/sharded.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/internal/metadata.h"
#include "comm/testing/thread_ranks.h"
#include "core/random.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "flatten/shard_math.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace checkpoint {
namespace {

using ::testing::HasSubstr;
using core::DType;
using core::Tensor;

// ---------------------------------------------------------------------------------
// A model's worth of tensors, sharded the way FSDP shards them: each unit's tensors are
// concatenated, padded to a multiple of the world size and chunked (flatten's shard
// math); a few tensors are replicated (every rank holds them in full).

struct Spec {
  std::string name;
  core::Shape shape;
  DType dtype;
};

struct Model {
  // Units of flat-sharded tensors (one dtype per unit, as in a FlatParameter).
  std::vector<std::vector<Spec>> units;
  std::vector<Spec> replicated;
  // The full value of every tensor.
  std::map<std::string, Tensor> full;
};

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Deterministic contents derived from the name and `version`.
Tensor MakeFull(const Spec& spec, int version) {
  Tensor t = Tensor::Empty(spec.shape, spec.dtype);
  core::Rng rng(Fnv1a(spec.name) + static_cast<uint64_t>(version));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = rng.Normal(0.0f, 1.0f);
    if (spec.dtype == DType::kFloat32) t.data<float>()[i] = v;
    if (spec.dtype == DType::kBFloat16) t.data<core::BFloat16>()[i] = core::BFloat16::FromFloat(v);
    if (spec.dtype == DType::kInt32) t.data<int32_t>()[i] = static_cast<int32_t>(rng.NextU64() % 100000);
  }
  return t;
}

Model MakeModel(int version = 0) {
  Model m;
  m.units = {
      {{"blocks.0.w", {5, 3}, DType::kFloat32},
       {"blocks.0.b", {3}, DType::kFloat32},
       {"blocks.0.empty", {0, 4}, DType::kFloat32},
       {"blocks.1.w", {4, 4}, DType::kFloat32},
       {"blocks.1.scalar", {}, DType::kFloat32}},
      {{"emb", {7, 2}, DType::kBFloat16}},
  };
  m.replicated = {{"optim.step", {1}, DType::kInt32}, {"norm.weight", {6}, DType::kFloat32}};
  for (const auto& unit : m.units) {
    for (const Spec& s : unit) m.full[s.name] = MakeFull(s, version);
  }
  for (const Spec& s : m.replicated) m.full[s.name] = MakeFull(s, version);
  return m;
}

// The [begin, end) ranges rank `rank` of `world` holds, per tensor name.
std::map<std::string, flatten::ShardSlice> RankRanges(const Model& m, int world, int rank) {
  std::map<std::string, flatten::ShardSlice> out;
  for (const auto& unit : m.units) {
    std::vector<int64_t> numels;
    for (const Spec& s : unit) numels.push_back(core::NumElements(s.shape));
    const std::vector<int64_t> offsets = flatten::FlatOffsets(numels).value();
    int64_t total = 0;
    for (int64_t n : numels) total += n;
    for (size_t i = 0; i < unit.size(); ++i) {
      out[unit[i].name] =
          flatten::IntersectRankChunk(offsets[i], numels[i], total, world, rank).value();
    }
  }
  for (const Spec& s : m.replicated) {
    out[s.name] = flatten::ShardSlice{0, core::NumElements(s.shape), 0};
  }
  return out;
}

// This rank's slices, each holding its own copy of its elements (as a sharded model
// would).
std::vector<TensorSlice> RankSlices(const Model& m, int world, int rank) {
  std::vector<TensorSlice> out;
  const auto ranges = RankRanges(m, world, rank);
  auto add = [&](const Spec& s) {
    const flatten::ShardSlice r = ranges.at(s.name);
    Tensor view = m.full.at(s.name).Flat().View(r.begin, {r.numel()}).value();
    out.push_back({s.name, s.shape, s.dtype, r.begin, r.end, view.Clone(core::MemoryTag::kParam)});
  };
  for (const auto& unit : m.units) {
    for (const Spec& s : unit) add(s);
  }
  for (const Spec& s : m.replicated) add(s);
  return out;
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(a.nbytes())) == 0;
}

std::string TestRoot(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/sharded_", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status SaveAt(int world, const std::string& dir, const Model& m,
                    const SaveOptions& options = SaveOptions()) {
  return comm::testing::RunThreadRanks(world, [=](comm::testing::RankContext& ctx) {
    return Save(dir, RankSlices(m, world, ctx.rank), options, ctx.group.get());
  });
}

// Every rank of `world` loads its own ranges and checks them bit for bit.
absl::Status LoadAndCheckAt(int world, const std::string& dir, const Model& m) {
  comm::testing::ThreadRanksOptions opts;
  opts.create_group = false;  // loading is not collective
  return comm::testing::RunThreadRanks(
      world,
      [=](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(CheckpointInfo info, ReadMetadata(dir));
        const auto ranges = RankRanges(m, world, ctx.rank);
        std::vector<LoadRequest> requests;
        std::vector<Tensor> expected;
        for (const TensorInfo& t : info.tensors) {
          const flatten::ShardSlice r = ranges.at(t.name);
          requests.push_back({t.name, r.begin, r.end, Tensor::Empty({r.numel()}, t.dtype)});
          expected.push_back(m.full.at(t.name).Flat().View(r.begin, {r.numel()}).value());
        }
        RETURN_IF_ERROR(Load(dir, requests).status());
        for (size_t i = 0; i < requests.size(); ++i) {
          if (!SameBytes(requests[i].destination, expected[i])) {
            return absl::InternalError(absl::StrCat("rank ", ctx.rank, " of ", world, ": tensor '",
                                                    requests[i].name, "' differs"));
          }
        }
        return absl::OkStatus();
      },
      opts);
}

std::string ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

CheckpointMetadata ReadProto(const std::string& dir) {
  const std::string path = dir + "/metadata.pb";
  absl::StatusOr<CheckpointMetadata> meta = internal::DecodeMetadataFile(ReadBytes(path), path);
  EXPECT_TRUE(meta.ok()) << meta.status();
  return meta.ok() ? *meta : CheckpointMetadata();
}

// Writes `meta` as `dir`'s metadata.pb with valid checksums (a forged checkpoint).
void WriteProto(const std::string& dir, const CheckpointMetadata& meta) {
  WriteBytes(dir + "/metadata.pb", internal::EncodeMetadataFile(meta));
}

// ---------------------------------------------------------------------------------

TEST(ShardedTest, SaveAtTwoLoadsBitExactAtOneThreeAndFour) {
  const std::string dir = TestRoot("two") + "/ckpt";
  const Model m = MakeModel();
  SaveOptions options;
  options.block_bytes = 16;  // small blocks, so reads start and end mid-chunk and mid-block
  options.step = 17;
  options.user_metadata = {{"model", "test"}};
  ASSERT_TRUE(SaveAt(2, dir, m, options).ok());

  absl::StatusOr<CheckpointInfo> info = ReadMetadata(dir);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->world_size, 2);
  EXPECT_EQ(info->step, 17);
  EXPECT_EQ(info->user_metadata.at("model"), "test");
  EXPECT_EQ(info->tensors.size(), m.full.size());
  for (const auto& [name, t] : m.full) {
    const TensorInfo* ti = info->Find(name);
    ASSERT_NE(ti, nullptr) << name;
    EXPECT_EQ(ti->shape, t.shape()) << name;
    EXPECT_EQ(ti->dtype, t.dtype()) << name;
  }
  EXPECT_EQ(Entries(dir), (std::vector<std::string>{"metadata.pb", "rank-00000-of-00002.bin",
                                                    "rank-00001-of-00002.bin"}));

  // World size 1: whole tensors.
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> all = LoadFull(dir);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), m.full.size());
  for (const auto& [name, t] : *all) {
    EXPECT_EQ(t.shape(), m.full.at(name).shape()) << name;
    EXPECT_TRUE(SameBytes(t, m.full.at(name))) << name;
  }
  for (int world : {1, 3, 4}) {
    absl::Status s = LoadAndCheckAt(world, dir, m);
    EXPECT_TRUE(s.ok()) << "world " << world << ": " << s;
  }
}

TEST(ShardedTest, SaveAtThreeLoadsAtTwo) {
  const std::string dir = TestRoot("three") + "/ckpt";
  const Model m = MakeModel(3);
  ASSERT_TRUE(SaveAt(3, dir, m).ok());
  EXPECT_EQ(ReadMetadata(dir).value().world_size, 3);
  absl::Status s = LoadAndCheckAt(2, dir, m);
  EXPECT_TRUE(s.ok()) << s;
}

TEST(ShardedTest, SingleProcessSaveRoundTrips) {
  const std::string dir = TestRoot("single") + "/nested/parent/ckpt";  // parents created
  const Model m = MakeModel(5);
  absl::Status s = Save(dir, RankSlices(m, 1, 0));
  ASSERT_TRUE(s.ok()) << s;
  auto all = LoadFull(dir, {"emb", "optim.step"});
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].first, "emb");
  EXPECT_TRUE(SameBytes((*all)[0].second, m.full.at("emb")));
  EXPECT_TRUE(SameBytes((*all)[1].second, m.full.at("optim.step")));
}

// NOTE [Replicated slices]: elements several ranks hold are written once, by the
// lowest rank holding them.
TEST(ShardedTest, ReplicatedElementsAreWrittenOnceByTheLowestRank) {
  const std::string dir = TestRoot("replicated") + "/ckpt";
  Tensor full = MakeFull({"overlap", {10}, DType::kFloat32}, 0);
  Tensor step = Tensor::FromInts({42}, {1}).value();
  absl::Status s = comm::testing::RunThreadRanks(3, [&](comm::testing::RankContext& ctx) {
    // Rank 0 holds [0, 6), rank 1 [4, 10), rank 2 [2, 9): overlapping ranges.
    const int64_t b[] = {0, 4, 2}, e[] = {6, 10, 9};
    Tensor mine = full.View(b[ctx.rank], {e[ctx.rank] - b[ctx.rank]}).value().Clone(core::MemoryTag::kParam);
    std::vector<TensorSlice> slices = {
        {"overlap", {10}, DType::kFloat32, b[ctx.rank], e[ctx.rank], mine},
        FullSlice("step", step.Clone(core::MemoryTag::kOptim)),
    };
    return Save(dir, slices, SaveOptions(), ctx.group.get());
  });
  ASSERT_TRUE(s.ok()) << s;
  const CheckpointMetadata meta = ReadProto(dir);
  std::map<std::string, std::vector<std::tuple<std::string, int64_t, int64_t>>> chunks;
  int64_t total_bytes = 0;
  for (const auto& t : meta.tensors()) {
    for (const auto& c : t.chunks()) {
      chunks[t.name()].push_back({c.file(), c.begin(), c.end()});
      total_bytes += c.byte_length();
    }
  }
  using Chunk = std::tuple<std::string, int64_t, int64_t>;
  EXPECT_EQ(chunks["overlap"], (std::vector<Chunk>{{"rank-00000-of-00003.bin", 0, 6},
                                                   {"rank-00001-of-00003.bin", 6, 10}}));
  EXPECT_EQ(chunks["step"], (std::vector<Chunk>{{"rank-00000-of-00003.bin", 0, 1}}));
  // Each element stored once: 10 floats and one int32; rank 2's file is empty.
  EXPECT_EQ(total_bytes, 10 * 4 + 4);
  EXPECT_EQ(std::filesystem::file_size(dir + "/rank-00002-of-00003.bin"), 0u);
  auto all = LoadFull(dir);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(SameBytes((*all)[0].second, full));
  EXPECT_EQ((*all)[1].second.data<int32_t>()[0], 42);
}

TEST(ShardedTest, Bf16StorageAndConversionOnSaveAndLoad) {
  const std::string dir = TestRoot("bf16") + "/ckpt";
  Tensor f32 = MakeFull({"x", {9}, DType::kFloat32}, 1);
  Tensor bf = MakeFull({"y", {5}, DType::kBFloat16}, 1);
  // x is fp32 data stored as bf16 (converted on save); y is stored as bf16.
  std::vector<TensorSlice> slices = {{"x", {9}, DType::kBFloat16, 0, 9, f32}, FullSlice("y", bf)};
  ASSERT_TRUE(Save(dir, slices).ok());
  EXPECT_EQ(ReadMetadata(dir).value().Find("x")->dtype, DType::kBFloat16);

  // Stored bf16 loaded into fp32 is exact (every bf16 is an fp32); into bf16 the bits
  // are those of FromFloat (round to nearest even).
  Tensor x_f32 = Tensor::Empty({9}, DType::kFloat32);
  Tensor x_bf = Tensor::Empty({3, 3}, DType::kBFloat16);  // any shape of the right numel
  Tensor y_f32 = Tensor::Empty({5}, DType::kFloat32);
  absl::StatusOr<LoadStats> st = Load(dir, {{"x", 0, 9, x_f32}, {"x", 0, 9, x_bf}, {"y", 0, 5, y_f32}});
  ASSERT_TRUE(st.ok()) << st.status();
  for (int i = 0; i < 9; ++i) {
    const core::BFloat16 want = core::BFloat16::FromFloat(f32.data<float>()[i]);
    EXPECT_EQ(x_bf.data<core::BFloat16>()[i].bits, want.bits) << i;
    EXPECT_EQ(x_f32.data<float>()[i], want.ToFloat()) << i;
  }
  for (int i = 0; i < 5; ++i) EXPECT_EQ(y_f32.data<float>()[i], bf.data<core::BFloat16>()[i].ToFloat());
}

TEST(ShardedTest, ZeroSizeTensorsRoundTrip) {
  const std::string dir = TestRoot("zero") + "/ckpt";
  Tensor empty = Tensor::Empty({0, 4});
  std::vector<TensorSlice> slices = {FullSlice("empty", empty),
                                     {"empty_undefined", {3, 0}, DType::kBFloat16, 0, 0, Tensor()}};
  ASSERT_TRUE(Save(dir, slices).ok());
  auto all = LoadFull(dir);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].second.shape(), (core::Shape{0, 4}));
  EXPECT_EQ((*all)[1].second.shape(), (core::Shape{3, 0}));
  EXPECT_EQ((*all)[1].second.dtype(), DType::kBFloat16);
  absl::StatusOr<LoadStats> st = Load(dir, {{"empty", 0, 0, Tensor()}});
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->bytes_read, 0);
}

// ---------------------------------------------------------------------------------
// Crashes and the atomic commit.

class CrashTest : public ::testing::TestWithParam<SimulatedCrash> {};

TEST_P(CrashTest, PreviousOrNewCheckpointStaysLoadable) {
  const std::string root = TestRoot(absl::StrCat("crash_", static_cast<int>(GetParam())));
  const std::string dir = root + "/ckpt";
  const Model v1 = MakeModel(1), v2 = MakeModel(2);
  ASSERT_TRUE(SaveAt(2, dir, v1).ok());

  SaveOptions crash;
  crash.simulate_crash = GetParam();
  absl::Status s = SaveAt(2, dir, v2, crash);
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("simulated crash"));
  // Temporaries are left behind, as after a real crash.
  EXPECT_EQ(Entries(root).size(), 2u);

  // kAfterRename crashed with the new checkpoint in place; the others before it.
  const Model& expected = GetParam() == SimulatedCrash::kAfterRename ? v2 : v1;
  absl::Status loaded = LoadAndCheckAt(2, dir, expected);
  EXPECT_TRUE(loaded.ok()) << loaded;

  absl::StatusOr<int> removed = CleanUpInterruptedSaves(dir);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 1);
  EXPECT_EQ(Entries(root), std::vector<std::string>{"ckpt"});
  loaded = LoadAndCheckAt(3, dir, expected);
  EXPECT_TRUE(loaded.ok()) << loaded;

  // A later save succeeds over it.
  ASSERT_TRUE(SaveAt(2, dir, v2).ok());
  loaded = LoadAndCheckAt(1, dir, v2);
  EXPECT_TRUE(loaded.ok()) << loaded;
  EXPECT_EQ(Entries(root), std::vector<std::string>{"ckpt"});
}

INSTANTIATE_TEST_SUITE_P(Points, CrashTest,
                         ::testing::Values(SimulatedCrash::kBeforeMetadata,
                                           SimulatedCrash::kBeforeRename,
                                           SimulatedCrash::kAfterRename));

// The window of the rename-aside commit (no RENAME_EXCHANGE): `<dir>` missing, the
// previous checkpoint complete under `<dir>.old-*`. Clean-up puts it back.
TEST(ShardedTest, CleanUpRestoresCheckpointMovedAside) {
  const std::string root = TestRoot("aside");
  const std::string dir = root + "/ckpt";
  const Model m = MakeModel(4);
  ASSERT_TRUE(Save(dir, RankSlices(m, 1, 0)).ok());
  std::filesystem::rename(dir, dir + ".old-0123456789abcdef");
  std::filesystem::create_directories(dir + ".tmp-fedcba9876543210");  // unfinished new one
  EXPECT_TRUE(absl::IsNotFound(ReadMetadata(dir).status()));
  absl::StatusOr<int> removed = CleanUpInterruptedSaves(dir);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 1);
  EXPECT_EQ(Entries(root), std::vector<std::string>{"ckpt"});
  absl::Status s = LoadAndCheckAt(1, dir, m);
  EXPECT_TRUE(s.ok()) << s;
}

// Several saves at once, to different directories and to the same one: every one
// gets its own temporary directory, all succeed, and the shared target ends up holding
// one complete checkpoint.
TEST(ShardedTest, ConcurrentSavesNeverCollide) {
  const std::string root = TestRoot("concurrent");
  constexpr int kThreads = 4;
  std::vector<Model> models;
  for (int i = 0; i < kThreads; ++i) models.push_back(MakeModel(10 + i));
  absl::Mutex mu;
  std::vector<absl::Status> errors;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < 3; ++round) {
        absl::Status a = Save(absl::StrCat(root, "/own", i), RankSlices(models[i], 1, 0));
        absl::Status b = Save(root + "/shared", RankSlices(models[i], 1, 0));
        absl::MutexLock lock(&mu);
        if (!a.ok()) errors.push_back(a);
        if (!b.ok()) errors.push_back(b);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) ADD_FAILURE() << e;
  EXPECT_EQ(Entries(root), (std::vector<std::string>{"own0", "own1", "own2", "own3", "shared"}));
  for (int i = 0; i < kThreads; ++i) {
    absl::Status s = LoadAndCheckAt(1, absl::StrCat(root, "/own", i), models[i]);
    EXPECT_TRUE(s.ok()) << s;
  }
  int matches = 0;
  for (int i = 0; i < kThreads; ++i) matches += LoadAndCheckAt(1, root + "/shared", models[i]).ok();
  EXPECT_EQ(matches, 1);
}

TEST(ShardedTest, RefusesToReplaceADirectoryThatIsNotACheckpoint) {
  const std::string root = TestRoot("foreign");
  const std::string dir = root + "/data";
  std::filesystem::create_directories(dir);
  { std::ofstream(dir + "/precious.txt") << "keep me"; }
  absl::Status s = Save(dir, RankSlices(MakeModel(), 1, 0));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(dir));
  EXPECT_TRUE(std::filesystem::exists(dir + "/precious.txt"));
  EXPECT_EQ(Entries(root), std::vector<std::string>{"data"});  // no temporaries left
}

// ---------------------------------------------------------------------------------
// Damaged files and bad requests.

const ChunkProto* FindChunk(const CheckpointMetadata& meta, const std::string& tensor,
                            const std::string& file) {
  for (const auto& t : meta.tensors()) {
    if (t.name() != tensor) continue;
    for (const auto& c : t.chunks()) {
      if (c.file() == file) return &c;
    }
  }
  return nullptr;
}

TEST(ShardedTest, FlippedByteIsRefusedNamingFileTensorAndByteRange) {
  const std::string dir = TestRoot("flip") + "/ckpt";
  const Model m = MakeModel();
  SaveOptions options;
  options.block_bytes = 16;
  ASSERT_TRUE(SaveAt(2, dir, m, options).ok());
  const std::string file = "rank-00000-of-00002.bin";
  const CheckpointMetadata meta = ReadProto(dir);
  const ChunkProto* c = FindChunk(meta, "blocks.0.w", file);
  ASSERT_NE(c, nullptr);
  ASSERT_GT(c->byte_length(), 20);
  const int64_t flip_at = c->byte_offset() + 20;  // inside the chunk's second block
  {
    std::fstream f(dir + "/" + file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(flip_at);
    char b = 0;
    f.read(&b, 1);
    b ^= 0x01;
    f.seekp(flip_at);
    f.write(&b, 1);
  }
  Tensor dest = Tensor::Empty({c->end() - c->begin()});
  absl::StatusOr<LoadStats> st = Load(dir, {{"blocks.0.w", c->begin(), c->end(), dest}});
  ASSERT_TRUE(absl::IsDataLoss(st.status())) << st.status();
  const std::string msg(st.status().message());
  EXPECT_THAT(msg, HasSubstr(dir + "/" + file));
  EXPECT_THAT(msg, HasSubstr("'blocks.0.w'"));
  // The block holding the flipped byte: chunk bytes [16, 32).
  EXPECT_THAT(msg, HasSubstr(absl::StrCat("bytes [", c->byte_offset() + 16, ", ",
                                          c->byte_offset() + 32, ")")));
  // Elements outside the damaged block still load: the reader verifies only what it reads.
  Tensor first = Tensor::Empty({4});
  EXPECT_TRUE(Load(dir, {{"blocks.0.w", c->begin(), c->begin() + 4, first}}).ok());
  // Other tensors are unaffected.
  Tensor emb = Tensor::Empty({14}, DType::kBFloat16);
  EXPECT_TRUE(Load(dir, {{"emb", 0, 14, emb}}).ok());
  EXPECT_TRUE(SameBytes(emb, m.full.at("emb")));
}

TEST(ShardedTest, TruncatedFileIsRefusedNamingFileAndTensor) {
  const std::string dir = TestRoot("truncate") + "/ckpt";
  const Model m = MakeModel();
  SaveOptions options;
  options.block_bytes = 16;
  ASSERT_TRUE(SaveAt(2, dir, m, options).ok());
  const std::string file = "rank-00001-of-00002.bin";
  const CheckpointMetadata meta = ReadProto(dir);
  // The chunk that ends last in rank 1's file, and one that ends before the cut.
  std::string last_tensor;
  const ChunkProto* last = nullptr;
  std::string early_tensor;
  const ChunkProto* early = nullptr;
  for (const auto& t : meta.tensors()) {
    for (const auto& c : t.chunks()) {
      if (c.file() != file) continue;
      if (last == nullptr || c.byte_offset() > last->byte_offset()) {
        last = &c;
        last_tensor = t.name();
      }
      if (early == nullptr || c.byte_offset() < early->byte_offset()) {
        early = &c;
        early_tensor = t.name();
      }
    }
  }
  ASSERT_NE(last, nullptr);
  ASSERT_NE(early, last);
  const int64_t cut = last->byte_offset() + 1;
  ASSERT_EQ(::truncate((dir + "/" + file).c_str(), cut), 0);

  Tensor dest = Tensor::Empty({last->end() - last->begin()}, m.full.at(last_tensor).dtype());
  absl::StatusOr<LoadStats> st = Load(dir, {{last_tensor, last->begin(), last->end(), dest}});
  ASSERT_TRUE(absl::IsDataLoss(st.status())) << st.status();
  const std::string msg(st.status().message());
  EXPECT_THAT(msg, HasSubstr(dir + "/" + file));
  EXPECT_THAT(msg, HasSubstr(absl::StrCat("'", last_tensor, "'")));
  EXPECT_THAT(msg, HasSubstr("truncated"));
  // NOTE [Checksum coverage]: the file's size is checked before any of it is used, so
  // even a chunk wholly before the cut is refused, naming the file and the tensor.
  Tensor early_dest = Tensor::Empty({early->end() - early->begin()}, m.full.at(early_tensor).dtype());
  st = Load(dir, {{early_tensor, early->begin(), early->end(), early_dest}});
  ASSERT_TRUE(absl::IsDataLoss(st.status())) << st.status();
  EXPECT_THAT(std::string(st.status().message()), HasSubstr(dir + "/" + file));
  EXPECT_THAT(std::string(st.status().message()), HasSubstr(absl::StrCat("'", early_tensor, "'")));
  EXPECT_THAT(std::string(st.status().message()), HasSubstr(absl::StrCat("has ", cut, " bytes")));
  EXPECT_THAT(std::string(st.status().message()),
              HasSubstr(absl::StrCat("ends inside tensor '", last_tensor, "'")));
  // Rank 0's file is intact: its tensors still load.
  Tensor emb = Tensor::Empty({14}, DType::kBFloat16);
  EXPECT_TRUE(Load(dir, {{"emb", 0, 7, emb.View(0, {7}).value()}}).ok());
  absl::StatusOr<LoadStats> verified = VerifyCheckpoint(dir);
  EXPECT_TRUE(absl::IsDataLoss(verified.status())) << verified.status();
  EXPECT_THAT(std::string(verified.status().message()), HasSubstr(dir + "/" + file));

  // A file longer than recorded is refused too.
  {
    std::ofstream f(dir + "/rank-00000-of-00002.bin", std::ios::binary | std::ios::app);
    f << '\0';
  }
  st = Load(dir, {{"emb", 0, 7, emb.View(0, {7}).value()}});
  ASSERT_TRUE(absl::IsDataLoss(st.status())) << st.status();
  EXPECT_THAT(std::string(st.status().message()), HasSubstr("rank-00000-of-00002.bin"));
  EXPECT_THAT(std::string(st.status().message()), HasSubstr("longer than recorded"));

  // A missing data file is refused the same way.
  std::filesystem::remove(dir + "/" + file);
  st = Load(dir, {{last_tensor, last->begin(), last->end(), dest}});
  EXPECT_TRUE(absl::IsDataLoss(st.status())) << st.status();
  EXPECT_THAT(std::string(st.status().message()), HasSubstr(dir + "/" + file));
}

TEST(ShardedTest, MetadataErrors) {
  const std::string root = TestRoot("meta");
  absl::StatusOr<CheckpointInfo> info = ReadMetadata(root + "/none");
  EXPECT_TRUE(absl::IsNotFound(info.status())) << info.status();
  EXPECT_THAT(std::string(info.status().message()), HasSubstr(root + "/none"));
  absl::StatusOr<LoadStats> st = Load(root + "/none", {});
  EXPECT_TRUE(absl::IsNotFound(st.status())) << st.status();

  const std::string dir = root + "/ckpt";
  ASSERT_TRUE(Save(dir, {FullSlice("a", Tensor::Zeros({4}))}).ok());
  { std::ofstream(dir + "/metadata.pb", std::ios::binary | std::ios::trunc) << "\xff\xff garbage"; }
  info = ReadMetadata(dir);
  EXPECT_TRUE(absl::IsDataLoss(info.status())) << info.status();
  EXPECT_THAT(std::string(info.status().message()), HasSubstr(dir + "/metadata.pb"));

  // Self-contradicting metadata: a chunk whose byte length does not match its range.
  ASSERT_TRUE(Save(dir, {FullSlice("a", Tensor::Zeros({4}))}).ok());
  CheckpointMetadata meta = ReadProto(dir);
  meta.mutable_tensors(0)->mutable_chunks(0)->set_byte_length(12);
  WriteProto(dir, meta);
  info = ReadMetadata(dir);
  EXPECT_TRUE(absl::IsDataLoss(info.status())) << info.status();
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("'a'"));
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("byte_length"));

  // An unsafe file name.
  meta = ReadProto(dir);
  meta.mutable_tensors(0)->mutable_chunks(0)->set_byte_length(16);
  meta.mutable_tensors(0)->mutable_chunks(0)->set_file("../escape.bin");
  WriteProto(dir, meta);
  EXPECT_TRUE(absl::IsDataLoss(ReadMetadata(dir).status()));
  meta.mutable_tensors(0)->mutable_chunks(0)->set_file("rank-00000-of-00001.bin");
  meta.mutable_files(0)->set_name("../escape.bin");
  WriteProto(dir, meta);
  EXPECT_TRUE(absl::IsDataLoss(ReadMetadata(dir).status()));

  // Format version 1: a bare CheckpointMetadata with no header. Refused, naming the
  // version, as FailedPrecondition (not damage: a format this build does not read).
  meta = ReadProto(dir);
  meta.set_format_version(1);
  WriteBytes(dir + "/metadata.pb", meta.SerializeAsString());
  info = ReadMetadata(dir);
  EXPECT_TRUE(absl::IsFailedPrecondition(info.status())) << info.status();
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("format version 1"));
  EXPECT_THAT(std::string(info.status().message()), HasSubstr(dir + "/metadata.pb"));
  // An intact header of a later version: FailedPrecondition naming it.
  meta.set_format_version(kFormatVersion + 1);
  WriteBytes(dir + "/metadata.pb", internal::EncodeMetadataFile(meta));
  info = ReadMetadata(dir);
  EXPECT_TRUE(absl::IsFailedPrecondition(info.status())) << info.status();
  EXPECT_THAT(std::string(info.status().message()),
              HasSubstr(absl::StrCat("format version ", kFormatVersion + 1)));
}

TEST(ShardedTest, BadRequestsNameTensorAndSizes) {
  const std::string dir = TestRoot("requests") + "/ckpt";
  ASSERT_TRUE(Save(dir, {FullSlice("w", Tensor::Zeros({2, 5})),
                         FullSlice("ids", Tensor::FromInts({1, 2, 3}, {3}).value())})
                  .ok());
  absl::StatusOr<LoadStats> st = Load(dir, {{"nope", 0, 1, Tensor::Empty({1})}});
  EXPECT_TRUE(absl::IsNotFound(st.status())) << st.status();
  EXPECT_THAT(std::string(st.status().message()), HasSubstr("'nope'"));

  st = Load(dir, {{"w", 8, 12, Tensor::Empty({4})}});
  EXPECT_TRUE(absl::IsInvalidArgument(st.status())) << st.status();
  EXPECT_THAT(std::string(st.status().message()), HasSubstr("'w'"));
  EXPECT_THAT(std::string(st.status().message()), HasSubstr("[8, 12)"));
  EXPECT_THAT(std::string(st.status().message()), HasSubstr("[2, 5]"));

  st = Load(dir, {{"w", 0, 4, Tensor::Empty({3})}});
  EXPECT_TRUE(absl::IsInvalidArgument(st.status())) << st.status();
  EXPECT_THAT(std::string(st.status().message()), HasSubstr("4 elements"));

  st = Load(dir, {{"ids", 0, 3, Tensor::Empty({3}, DType::kFloat32)}});
  EXPECT_TRUE(absl::IsInvalidArgument(st.status())) << st.status();
  EXPECT_THAT(std::string(st.status().message()), HasSubstr("int32"));

  st = Load(dir, {{"w", 0, 2, Tensor()}});
  EXPECT_TRUE(absl::IsInvalidArgument(st.status())) << st.status();
}

// Save's argument checks: every rank returns the same error, and `dir` keeps the
// previous checkpoint with no temporaries left.
TEST(ShardedTest, InvalidSlicesFailOnEveryRankAndLeaveDirUntouched) {
  const std::string root = TestRoot("invalid");
  const std::string dir = root + "/ckpt";
  const Model m = MakeModel(7);
  ASSERT_TRUE(SaveAt(2, dir, m).ok());

  struct Case {
    std::string name;
    std::function<std::vector<TensorSlice>(int rank)> slices;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"shape disagreement",
       [](int rank) {
         return std::vector<TensorSlice>{
             FullSlice("t", Tensor::Zeros(rank == 0 ? core::Shape{4} : core::Shape{2, 2}))};
       },
       "ranks disagree on tensor 't'"},
      {"gap",
       [](int rank) {
         const int64_t b = rank == 0 ? 0 : 6;
         return std::vector<TensorSlice>{{"t", {10}, DType::kFloat32, b, b + 3, Tensor::Zeros({3})}};
       },
       "elements [3, 6) are held by no rank"},
      {"data size",
       [](int rank) {
         return std::vector<TensorSlice>{{"t", {10}, DType::kFloat32, 0, 10, Tensor::Zeros({rank + 9})}};
       },
       "tensor 't'"},
      {"duplicate",
       [](int) {
         return std::vector<TensorSlice>{FullSlice("t", Tensor::Zeros({2})), FullSlice("t", Tensor::Zeros({2}))};
       },
       "listed twice"},
      {"out of range",
       [](int) { return std::vector<TensorSlice>{{"t", {4}, DType::kFloat32, 2, 6, Tensor::Zeros({4})}}; },
       "[2, 6) is out of range"},
      {"int32 as float",
       [](int) {
         return std::vector<TensorSlice>{{"t", {1}, DType::kFloat32, 0, 1, Tensor::FromInts({1}, {1}).value()}};
       },
       "cannot be stored as float32"},
  };
  for (const Case& c : cases) {
    absl::Mutex mu;
    std::vector<std::string> messages;
    absl::Status s = comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) {
      absl::Status r = Save(dir, c.slices(ctx.rank), SaveOptions(), ctx.group.get());
      absl::MutexLock lock(&mu);
      messages.push_back(std::string(r.message()));
      return r.ok() ? absl::InternalError("Save succeeded") : absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << c.name << ": " << s;
    ASSERT_EQ(messages.size(), 2u) << c.name;
    EXPECT_EQ(messages[0], messages[1]) << c.name;
    EXPECT_THAT(messages[0], HasSubstr(c.expect)) << c.name;
    EXPECT_EQ(Entries(root), std::vector<std::string>{"ckpt"}) << c.name;
  }
  absl::Status s = LoadAndCheckAt(2, dir, m);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(absl::IsInvalidArgument(Save("", {})));
  SaveOptions bad;
  bad.block_bytes = 0;
  EXPECT_THAT(std::string(Save(dir, {}, bad).message()), HasSubstr("block_bytes"));
}

// Expected bytes a load of [begin, end) of `tensor` reads: for each chunk it overlaps,
// the whole checksum blocks (block_bytes, counted from the chunk's first byte, the last
// one possibly short) that hold any requested element.
struct BlockCount {
  int64_t bytes = 0;
  int64_t blocks = 0;
};
BlockCount OverlappingBlocks(const CheckpointMetadata& meta, const std::string& tensor,
                             int64_t begin, int64_t end, int64_t elem) {
  const int64_t block = meta.block_bytes();
  BlockCount total;
  for (const auto& t : meta.tensors()) {
    if (t.name() != tensor) continue;
    for (const auto& c : t.chunks()) {
      for (int64_t off = 0; off < c.byte_length(); off += block) {
        const int64_t len = std::min(block, c.byte_length() - off);
        const int64_t first = c.begin() + off / elem, last = c.begin() + (off + len) / elem;
        if (first < end && last > begin) {
          total.bytes += len;
          ++total.blocks;
        }
      }
    }
  }
  return total;
}

TEST(ShardedTest, LoaderReadsOnlyTheBlocksItNeeds) {
  const std::string dir = TestRoot("stats") + "/ckpt";
  Tensor big = MakeFull({"big", {1000}, DType::kFloat32}, 0);
  SaveOptions options;
  options.block_bytes = 64;
  ASSERT_TRUE(comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) {
                const int64_t b = ctx.rank * 500;
                Tensor mine = big.View(b, {500}).value().Clone(core::MemoryTag::kParam);
                return Save(dir, {{"big", {1000}, DType::kFloat32, b, b + 500, mine}}, options,
                            ctx.group.get());
              }).ok());
  const CheckpointMetadata meta = ReadProto(dir);
  struct Range {
    int64_t begin, end;
  };
  // Inside one block; across a block edge; across the two ranks' chunks; everything.
  for (const Range r : {Range{100, 110}, Range{15, 17}, Range{495, 505}, Range{0, 1000}}) {
    Tensor dest = Tensor::Empty({r.end - r.begin});
    absl::StatusOr<LoadStats> st = Load(dir, {{"big", r.begin, r.end, dest}});
    ASSERT_TRUE(st.ok()) << st.status();
    const BlockCount expected = OverlappingBlocks(meta, "big", r.begin, r.end, 4);
    EXPECT_EQ(st->bytes_read, expected.bytes) << "[" << r.begin << ", " << r.end << ")";
    EXPECT_EQ(st->blocks_verified, expected.blocks) << "[" << r.begin << ", " << r.end << ")";
    // At most one partial block of overshoot at each end of each of the (at most two)
    // chunks touched.
    EXPECT_LE(st->bytes_read, (r.end - r.begin) * 4 + 2 * 2 * options.block_bytes);
    EXPECT_EQ(st->files_opened, (r.begin < 500) + (r.end > 500));
    EXPECT_TRUE(SameBytes(dest, big.View(r.begin, {r.end - r.begin}).value()));
  }
}

// ---------------------------------------------------------------------------------
// NOTE [Checksum coverage]: every bit of every file is checked before use.

// The names of the tensors with a chunk holding byte `offset` of data file `file`.
std::vector<std::string> TensorsAtByte(const CheckpointMetadata& meta, const std::string& file,
                                       int64_t offset) {
  std::vector<std::string> out;
  for (const auto& t : meta.tensors()) {
    for (const auto& c : t.chunks()) {
      if (c.file() == file && offset >= c.byte_offset() && offset < c.byte_offset() + c.byte_length()) {
        out.push_back(t.name());
      }
    }
  }
  return out;
}

// Flips EVERY bit of a real metadata.pb (a two-rank checkpoint of the test model, with
// user metadata and a record) in turn: each flip must be refused with DataLoss naming
// the file, by ReadMetadata and by Load alike. Zero silent loads.
TEST(ShardedTest, EveryMetadataBitFlipIsRefusedAsDataLossNamingTheFile) {
  const std::string dir = TestRoot("meta_flips") + "/ckpt";
  const Model m = MakeModel(2);
  SaveOptions options;
  options.step = 60;
  options.block_bytes = 32;
  options.user_metadata = {{"run", "alpha"}};
  options.records = {{"test.record", std::string("\x00\x01\xff binary", 10)}};
  ASSERT_TRUE(SaveAt(2, dir, m, options).ok());
  const std::string path = dir + "/metadata.pb";
  const std::string original = ReadBytes(path);
  ASSERT_GT(original.size(), 200u);
  int refused = 0, silent = 0;
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  for (size_t byte = 0; byte < original.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      const char flipped = static_cast<char>(original[byte] ^ (1 << bit));
      ASSERT_EQ(::pwrite(fd, &flipped, 1, static_cast<off_t>(byte)), 1);
      absl::StatusOr<CheckpointInfo> info = ReadMetadata(dir);
      absl::StatusOr<LoadStats> load = Load(dir, {{"emb", 0, 14, Tensor::Empty({14}, DType::kBFloat16)}});
      const bool ok = absl::IsDataLoss(info.status()) && absl::IsDataLoss(load.status()) &&
                      absl::StrContains(info.status().message(), path) &&
                      absl::StrContains(load.status().message(), path);
      if (ok) {
        ++refused;
      } else {
        ++silent;
        ADD_FAILURE() << "flip of bit " << bit << " of byte " << byte << ": ReadMetadata "
                      << info.status() << ", Load " << load.status();
        if (silent > 5) FAIL() << "giving up";
      }
    }
    ASSERT_EQ(::pwrite(fd, &original[byte], 1, static_cast<off_t>(byte)), 1);
  }
  ::close(fd);
  std::cout << "metadata.pb of " << original.size() << " bytes: " << refused << " of "
            << original.size() * 8 << " single-bit flips refused as DataLoss, " << silent
            << " loaded" << std::endl;
  EXPECT_EQ(refused, static_cast<int>(original.size() * 8));
  EXPECT_EQ(silent, 0);
  WriteBytes(path, original);
  EXPECT_TRUE(ReadMetadata(dir).ok());
  EXPECT_EQ(ReadMetadata(dir)->step, 60);
  EXPECT_EQ(ReadMetadata(dir)->records.at("test.record"), options.records.at("test.record"));
}

// Every truncation of metadata.pb, and an appended byte, is DataLoss naming the file.
TEST(ShardedTest, TruncatedOrExtendedMetadataIsRefused) {
  const std::string dir = TestRoot("meta_truncate") + "/ckpt";
  ASSERT_TRUE(SaveAt(2, dir, MakeModel(3)).ok());
  const std::string path = dir + "/metadata.pb";
  const std::string original = ReadBytes(path);
  for (size_t n = 0; n < original.size(); ++n) {
    WriteBytes(path, original.substr(0, n));
    absl::StatusOr<CheckpointInfo> info = ReadMetadata(dir);
    ASSERT_TRUE(absl::IsDataLoss(info.status())) << n << " bytes: " << info.status();
    ASSERT_THAT(std::string(info.status().message()), HasSubstr(path)) << n;
  }
  WriteBytes(path, original + "x");
  absl::StatusOr<CheckpointInfo> info = ReadMetadata(dir);
  EXPECT_TRUE(absl::IsDataLoss(info.status())) << info.status();
  EXPECT_THAT(std::string(info.status().message()), HasSubstr(path));
}

// Flips 200 bits spread over each data file: every load of a tensor holding the damaged
// byte is DataLoss naming the file and the tensor, and so is VerifyCheckpoint; after
// the byte is restored everything loads again.
TEST(ShardedTest, DataFileBitFlipsAreRefusedForEveryTensorTheyTouch) {
  const std::string dir = TestRoot("data_flips") + "/ckpt";
  const Model m = MakeModel(4);
  SaveOptions options;
  options.block_bytes = 24;
  ASSERT_TRUE(SaveAt(2, dir, m, options).ok());
  const CheckpointMetadata meta = ReadProto(dir);
  int flips = 0;
  for (const auto& f : meta.files()) {
    const std::string path = dir + "/" + f.name();
    const std::string original = ReadBytes(path);
    ASSERT_EQ(static_cast<int64_t>(original.size()), f.size_bytes());
    ASSERT_GT(original.size(), 0u);
    constexpr int kFlips = 200;
    for (int k = 0; k < kFlips; ++k) {
      const int64_t offset = static_cast<int64_t>(k * original.size() / kFlips);
      const int bit = k % 8;
      std::string flipped = original;
      flipped[offset] = static_cast<char>(flipped[offset] ^ (1 << bit));
      WriteBytes(path, flipped);
      const std::vector<std::string> owners = TensorsAtByte(meta, f.name(), offset);
      ASSERT_EQ(owners.size(), 1u) << "byte " << offset << " of " << f.name()
                                   << " must belong to exactly one chunk";
      absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> loaded = LoadFull(dir, owners);
      ASSERT_TRUE(absl::IsDataLoss(loaded.status()))
          << f.name() << " byte " << offset << " bit " << bit << ": " << loaded.status();
      EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(path));
      EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("'" + owners[0] + "'"));
      absl::StatusOr<LoadStats> verified = VerifyCheckpoint(dir);
      ASSERT_TRUE(absl::IsDataLoss(verified.status())) << verified.status();
      EXPECT_THAT(std::string(verified.status().message()), HasSubstr(path));
      ++flips;
    }
    WriteBytes(path, original);
  }
  std::cout << flips << " data file bit flips, each refused" << std::endl;
  absl::StatusOr<LoadStats> verified = VerifyCheckpoint(dir);
  ASSERT_TRUE(verified.ok()) << verified.status();
  int64_t total = 0;
  for (const auto& f : meta.files()) total += f.size_bytes();
  EXPECT_GE(verified->bytes_read, total) << "every byte of every data file read";
  EXPECT_TRUE(LoadAndCheckAt(2, dir, m).ok());
}

// ---------------------------------------------------------------------------------
// NOTE [Save lock]: interrupted saves are tidied by the next one.

class CrashThenSaveTest : public ::testing::TestWithParam<SimulatedCrash> {};

TEST_P(CrashThenSaveTest, NextSaveLeavesNoTemporaries) {
  const std::string root = TestRoot(absl::StrCat("crash_then_save_", static_cast<int>(GetParam())));
  const std::string dir = root + "/ckpt";
  const Model v1 = MakeModel(1), v2 = MakeModel(2), v3 = MakeModel(3);
  ASSERT_TRUE(SaveAt(2, dir, v1).ok());
  SaveOptions crash;
  crash.simulate_crash = GetParam();
  EXPECT_TRUE(absl::IsAborted(SaveAt(2, dir, v2, crash)));
  EXPECT_EQ(Entries(root).size(), 2u) << "the crashed save's temporary directory";
  // A second crash leaves a second one; the next save deletes both.
  EXPECT_TRUE(absl::IsAborted(SaveAt(2, dir, v2, crash)));
  EXPECT_EQ(Entries(root).size(), 2u) << "the first temporary was deleted by the second save";
  ASSERT_TRUE(SaveAt(2, dir, v3).ok());
  EXPECT_EQ(Entries(root), std::vector<std::string>{"ckpt"});
  EXPECT_TRUE(LoadAndCheckAt(1, dir, v3).ok());
}

INSTANTIATE_TEST_SUITE_P(Points, CrashThenSaveTest,
                         ::testing::Values(SimulatedCrash::kBeforeMetadata,
                                           SimulatedCrash::kBeforeRename,
                                           SimulatedCrash::kAfterRename));

// With `<dir>` missing and the previous checkpoint moved aside (the rename-aside
// window), the next Save restores it first and then replaces it, leaving nothing else.
TEST(ShardedTest, SaveAfterCrashInTheRenameWindowLeavesOnlyTheNewCheckpoint) {
  const std::string root = TestRoot("save_after_aside");
  const std::string dir = root + "/ckpt";
  ASSERT_TRUE(Save(dir, RankSlices(MakeModel(1), 1, 0)).ok());
  std::filesystem::rename(dir, dir + ".old-0123456789abcdef");
  std::filesystem::create_directories(dir + ".tmp-fedcba9876543210");
  const Model m = MakeModel(6);
  ASSERT_TRUE(Save(dir, RankSlices(m, 1, 0)).ok());
  EXPECT_EQ(Entries(root), std::vector<std::string>{"ckpt"});
  EXPECT_TRUE(LoadAndCheckAt(1, dir, m).ok());
}

// While someone holds `<dir>.lock`, CleanUpInterruptedSaves deletes nothing and Save
// gives up after half its timeout, naming the lock; neither leaves anything behind.
TEST(ShardedTest, HeldLockStopsCleanUpAndSave) {
  const std::string root = TestRoot("held_lock");
  const std::string dir = root + "/ckpt";
  const Model m = MakeModel(1);
  ASSERT_TRUE(Save(dir, RankSlices(m, 1, 0)).ok());
  std::filesystem::create_directories(dir + ".tmp-0000000000000001");
  const int fd = ::open((dir + ".lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  absl::StatusOr<int> cleaned = CleanUpInterruptedSaves(dir);
  EXPECT_TRUE(absl::IsFailedPrecondition(cleaned.status())) << cleaned.status();
  EXPECT_THAT(std::string(cleaned.status().message()), HasSubstr(dir + ".lock"));
  SaveOptions quick;
  quick.timeout = absl::Milliseconds(400);
  absl::Status s = Save(dir, RankSlices(MakeModel(2), 1, 0), quick);
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(dir + ".lock"));
  EXPECT_TRUE(std::filesystem::exists(dir + ".tmp-0000000000000001")) << "nothing deleted";
  ::close(fd);  // releases the lock (the file stays: the holder did not remove it)
  cleaned = CleanUpInterruptedSaves(dir);
  ASSERT_TRUE(cleaned.ok()) << cleaned.status();
  EXPECT_EQ(*cleaned, 1);
  EXPECT_EQ(Entries(root), std::vector<std::string>{"ckpt"}) << "the lock file is removed too";
  EXPECT_TRUE(LoadAndCheckAt(1, dir, m).ok());
}

// A save whose exchange fails (rank 1 never joins, so rank 0's all-gather times out)
// deletes its own temporary directory.
TEST(ShardedTest, FailedExchangeDeletesItsTemporaryDirectory) {
  const std::string root = TestRoot("failed_exchange");
  const std::string dir = root + "/ckpt";
  const Model m = MakeModel(1);
  absl::Status rank0 = absl::OkStatus();
  absl::Status s = comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) {
    if (ctx.rank == 1) return absl::OkStatus();  // never calls Save
    SaveOptions quick;
    quick.timeout = absl::Seconds(1);
    rank0 = Save(dir, RankSlices(m, 2, 0), quick, ctx.group.get());
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_FALSE(rank0.ok());
  EXPECT_TRUE(Entries(root).empty()) << "left: " << absl::StrJoin(Entries(root), ", ");
}

}  // namespace
}  // namespace checkpoint
