// Tests of checkpoint::Save / Load / LoadFull / CleanUpInterruptedSaves: round trips
// across world sizes, replicated slices, dtypes, crashes and the atomic commit, damaged
// files and bad requests. The checksum coverage and the save lock have their own file
// (sharded_integrity_test.cc).
#include "checkpoint/sharded.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/testing/sharded_model.h"
#include "comm/testing/thread_ranks.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "flatten/shard_math.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace checkpoint {
namespace {

using core::DType;
using core::Tensor;
using testing::Entries;
using ::testing::HasSubstr;
using testing::LoadAndCheckAt;
using testing::MakeFull;
using testing::MakeModel;
using testing::Model;
using testing::RankSlices;
using testing::ReadBytes;
using testing::ReadProto;
using testing::SameBytes;
using testing::SaveAt;
using testing::TestRoot;
using testing::WriteBytes;
using testing::WriteProto;

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
    Tensor mine =
        full.View(b[ctx.rank], {e[ctx.rank] - b[ctx.rank]}).value().Clone(core::MemoryTag::kParam);
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
  absl::StatusOr<LoadStats> st =
      Load(dir, {{"x", 0, 9, x_f32}, {"x", 0, 9, x_bf}, {"y", 0, 5, y_f32}});
  ASSERT_TRUE(st.ok()) << st.status();
  for (int i = 0; i < 9; ++i) {
    const core::BFloat16 want = core::BFloat16::FromFloat(f32.data<float>()[i]);
    EXPECT_EQ(x_bf.data<core::BFloat16>()[i].bits, want.bits) << i;
    EXPECT_EQ(x_f32.data<float>()[i], want.ToFloat()) << i;
  }
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(y_f32.data<float>()[i], bf.data<core::BFloat16>()[i].ToFloat());
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
  Tensor early_dest =
      Tensor::Empty({early->end() - early->begin()}, m.full.at(early_tensor).dtype());
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
  WriteProto(dir, meta);  // with valid checksums
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
         return std::vector<TensorSlice>{
             {"t", {10}, DType::kFloat32, b, b + 3, Tensor::Zeros({3})}};
       },
       "elements [3, 6) are held by no rank"},
      {"data size",
       [](int rank) {
         return std::vector<TensorSlice>{
             {"t", {10}, DType::kFloat32, 0, 10, Tensor::Zeros({rank + 9})}};
       },
       "tensor 't'"},
      {"duplicate",
       [](int) {
         return std::vector<TensorSlice>{FullSlice("t", Tensor::Zeros({2})),
                                         FullSlice("t", Tensor::Zeros({2}))};
       },
       "listed twice"},
      {"out of range",
       [](int) {
         return std::vector<TensorSlice>{{"t", {4}, DType::kFloat32, 2, 6, Tensor::Zeros({4})}};
       },
       "[2, 6) is out of range"},
      {"int32 as float",
       [](int) {
         return std::vector<TensorSlice>{
             {"t", {1}, DType::kFloat32, 0, 1, Tensor::FromInts({1}, {1}).value()}};
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

}  // namespace
}  // namespace checkpoint

namespace checkpoint {
namespace {

using ::testing::HasSubstr;
using testing::LoadAndCheckAt;
using testing::MakeModel;
using testing::Model;
using testing::RankSlices;
using testing::TestRoot;

// NOTE [Asynchronous save]: the slices are snapshotted by BeginSave (the caller overwrites
// them before Finish and the checkpoint holds the values they had), nothing is committed
// before Finish (the previous checkpoint is what `dir` holds until then), and Finish commits.
TEST(AsyncSaveTest, TheSnapshotIsWrittenInTheBackgroundAndCommittedAtFinish) {
  const std::string dir = TestRoot("async") + "/ckpt";
  const Model before = MakeModel(1), after = MakeModel(2);
  ASSERT_TRUE(testing::SaveAt(2, dir, before).ok());
  absl::Status s = comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) {
    // Private copies of this rank's slices of `after`, overwritten once BeginSave returns.
    std::vector<TensorSlice> slices = RankSlices(after, 2, ctx.rank);
    for (TensorSlice& t : slices) t.data = t.data.Clone(core::MemoryTag::kParam);
    ASSIGN_OR_RETURN(std::unique_ptr<PendingSave> pending,
                     BeginSave(dir, slices, SaveOptions(), ctx.group.get(), /*background=*/true));
    for (TensorSlice& t : slices) RETURN_IF_ERROR(t.data.TryFill(-1.0f));
    while (!pending->WriteDone()) std::this_thread::yield();
    // Not committed yet: `dir` is still the earlier checkpoint.
    RETURN_IF_ERROR(LoadAndCheckAt(1, dir, before));
    return pending->Finish();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int world : {1, 3}) {
    absl::Status loaded = LoadAndCheckAt(world, dir, after);
    EXPECT_TRUE(loaded.ok()) << "world " << world << ": " << loaded;
  }
  EXPECT_EQ(CleanUpInterruptedSaves(dir).value(), 0) << "no temporary left";
}

TEST(AsyncSaveTest, ABackgroundWriteFailureIsEveryRanksErrorAndKeepsThePreviousCheckpoint) {
  const std::string dir = TestRoot("async_fail") + "/ckpt";
  const Model before = MakeModel(1), after = MakeModel(2);
  ASSERT_TRUE(testing::SaveAt(2, dir, before).ok());
  std::vector<absl::Status> finished(2);
  absl::Status s = comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) {
    SaveOptions options;
    if (ctx.rank == 1) {
      options.simulate_write_error = absl::ResourceExhaustedError("No space left on device");
    }
    ASSIGN_OR_RETURN(std::unique_ptr<PendingSave> pending,
                     BeginSave(dir, RankSlices(after, 2, ctx.rank), options, ctx.group.get(),
                               /*background=*/true));
    finished[ctx.rank] = pending->Finish();
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(finished[r].code(), absl::StatusCode::kResourceExhausted) << finished[r];
    EXPECT_THAT(finished[r].message(), HasSubstr("rank 1: No space left on device"));
  }
  absl::Status kept = LoadAndCheckAt(2, dir, before);
  EXPECT_TRUE(kept.ok()) << kept;
  EXPECT_EQ(CleanUpInterruptedSaves(dir).value(), 0) << "no temporary left";
}

}  // namespace
}  // namespace checkpoint
