// Tests that a checkpoint refuses what it cannot verify (NOTE [Checksum coverage]:
// every bit of metadata.pb and of every data file, truncation) and that interrupted
// saves are tidied by the next one under NOTE [Save lock].
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/sharded.h"
#include "checkpoint/testing/sharded_model.h"
#include "comm/testing/thread_ranks.h"
#include "core/tensor.h"
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

// NOTE [Checksum coverage]: every bit of every file is checked before use.

// The names of the tensors with a chunk holding byte `offset` of data file `file`.
std::vector<std::string> TensorsAtByte(const CheckpointMetadata& meta, const std::string& file,
                                       int64_t offset) {
  std::vector<std::string> out;
  for (const auto& t : meta.tensors()) {
    for (const auto& c : t.chunks()) {
      if (c.file() == file && offset >= c.byte_offset() &&
          offset < c.byte_offset() + c.byte_length()) {
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
      absl::StatusOr<LoadStats> load =
          Load(dir, {{"emb", 0, 14, Tensor::Empty({14}, DType::kBFloat16)}});
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
      ASSERT_EQ(owners.size(), 1u)
          << "byte " << offset << " of " << f.name() << " must belong to exactly one chunk";
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
