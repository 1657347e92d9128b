// Tests of the metadata.pb codec and validator (internal/metadata.h): the checksummed
// header round-trips and refuses damage and other versions, and every untrusted size is
// checked, overflow included, with DataLoss naming the field.
#include "checkpoint/internal/metadata.h"

#include <cstdint>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace checkpoint {
namespace internal {
namespace {

using ::testing::HasSubstr;

constexpr char kPath[] = "/ckpt/metadata.pb";
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// One data file of 24 bytes: "a", float32 [2, 2] at bytes [0, 16) in two 8-byte
// blocks, then "b", int32 [2] at [16, 24) in one.
CheckpointMetadata Valid() {
  CheckpointMetadata meta;
  meta.set_format_version(kFormatVersion);
  meta.set_world_size(1);
  meta.set_step(60);
  meta.set_block_bytes(8);
  DataFileProto* f = meta.add_files();
  f->set_name(DataFileName(0, 1));
  f->set_rank(0);
  f->set_size_bytes(24);
  TensorProto* a = meta.add_tensors();
  a->set_name("a");
  a->add_shape(2);
  a->add_shape(2);
  a->set_dtype("float32");
  ChunkProto* ca = a->add_chunks();
  ca->set_file(f->name());
  ca->set_begin(0);
  ca->set_end(4);
  ca->set_byte_offset(0);
  ca->set_byte_length(16);
  ca->add_block_crc32c(1);
  ca->add_block_crc32c(2);
  TensorProto* b = meta.add_tensors();
  b->set_name("b");
  b->add_shape(2);
  b->set_dtype("int32");
  ChunkProto* cb = b->add_chunks();
  cb->set_file(f->name());
  cb->set_begin(0);
  cb->set_end(2);
  cb->set_byte_offset(16);
  cb->set_byte_length(8);
  cb->add_block_crc32c(3);
  return meta;
}

TEST(MetadataTest, ValidMetadataRoundTripsThroughTheFile) {
  const CheckpointMetadata meta = Valid();
  const std::string bytes = EncodeMetadataFile(meta);
  ASSERT_EQ(bytes.size(), kMetadataHeaderBytes + meta.ByteSizeLong());
  EXPECT_EQ(bytes.substr(0, 8), "FSDPCKPT");
  absl::StatusOr<MetadataIndex> index = ParseMetadataFile(bytes, "/ckpt", kPath);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->proto.SerializeAsString(), meta.SerializeAsString());
  EXPECT_EQ(index->Find("b"), 1);
  EXPECT_EQ(index->numels[0], 4);
  EXPECT_EQ(index->file_sizes.at(DataFileName(0, 1)), 24);
}

TEST(MetadataTest, DamagedHeadersAndBodiesAreDataLossNamingTheFile) {
  const std::string good = EncodeMetadataFile(Valid());
  struct Case {
    std::string name;
    std::string bytes;
    std::string expect;
  };
  std::string bad_magic = good;
  bad_magic[0] = 'G';
  std::string bad_header = good;
  bad_header[13] ^= 0x01;  // body length
  std::string bad_body = good;
  bad_body[kMetadataHeaderBytes + 3] ^= 0x10;
  std::string bad_crc = good;
  bad_crc[21] ^= 0x80;  // body CRC
  const std::vector<Case> cases = {
      {"empty", "", "magic"},
      {"magic only", good.substr(0, 8), "shorter than the 28-byte header"},
      {"bad magic", bad_magic, "magic"},
      {"damaged header", bad_header, "header checksum"},
      {"damaged body", bad_body, "body checksum"},
      {"damaged body checksum", bad_crc, "header checksum"},  // the header covers it
      {"truncated body", good.substr(0, good.size() - 1), "truncated"},
      {"extended body", good + "x", "1 bytes follow"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<CheckpointMetadata> meta = DecodeMetadataFile(c.bytes, kPath);
    EXPECT_TRUE(absl::IsDataLoss(meta.status())) << c.name << ": " << meta.status();
    EXPECT_THAT(std::string(meta.status().message()), HasSubstr(kPath)) << c.name;
    EXPECT_THAT(std::string(meta.status().message()), HasSubstr(c.expect)) << c.name;
  }
}

TEST(MetadataTest, OtherVersionsAreFailedPreconditionNamingTheVersion) {
  CheckpointMetadata v1 = Valid();
  v1.set_format_version(1);
  absl::StatusOr<CheckpointMetadata> meta = DecodeMetadataFile(v1.SerializeAsString(), kPath);
  EXPECT_TRUE(absl::IsFailedPrecondition(meta.status())) << meta.status();
  EXPECT_THAT(std::string(meta.status().message()), HasSubstr("format version 1"));
  EXPECT_THAT(std::string(meta.status().message()), HasSubstr("does not convert old checkpoints"));
  CheckpointMetadata v9 = Valid();
  v9.set_format_version(9);
  meta = DecodeMetadataFile(EncodeMetadataFile(v9), kPath);
  EXPECT_TRUE(absl::IsFailedPrecondition(meta.status())) << meta.status();
  EXPECT_THAT(std::string(meta.status().message()), HasSubstr("format version 9"));
  EXPECT_TRUE(absl::IsFailedPrecondition(IndexMetadata(v9, "/ckpt", kPath).status()));
}

// Every size the metadata carries is untrusted: each mutation below must be refused
// with DataLoss naming the field, and none may overflow (the build's sanitizers and
// the fuzz target check the arithmetic).
TEST(MetadataTest, UntrustedSizesAreCheckedNamingTheField) {
  struct Case {
    std::string name;
    std::function<void(CheckpointMetadata&)> mutate;
    std::string expect;
  };
  auto chunk = [](CheckpointMetadata& m, int t) { return m.mutable_tensors(t)->mutable_chunks(0); };
  const std::vector<Case> cases = {
      {"block_bytes max", [](CheckpointMetadata& m) { m.set_block_bytes(kMax); }, "block_bytes"},
      {"block_bytes 0", [](CheckpointMetadata& m) { m.set_block_bytes(0); }, "block_bytes"},
      {"block_bytes negative", [](CheckpointMetadata& m) { m.set_block_bytes(-8); }, "block_bytes"},
      {"world_size 0", [](CheckpointMetadata& m) { m.set_world_size(0); }, "world_size"},
      {"world_size 2", [](CheckpointMetadata& m) { m.set_world_size(2); }, "files"},
      {"size_bytes negative", [](CheckpointMetadata& m) { m.mutable_files(0)->set_size_bytes(-1); },
       "size_bytes"},
      {"size_bytes max", [](CheckpointMetadata& m) { m.mutable_files(0)->set_size_bytes(kMax); },
       "size_bytes"},
      {"size_bytes short", [](CheckpointMetadata& m) { m.mutable_files(0)->set_size_bytes(20); },
       "byte_offset"},
      {"file rank", [](CheckpointMetadata& m) { m.mutable_files(0)->set_rank(3); }, "files[0]"},
      {"shape overflow",
       [](CheckpointMetadata& m) {
         m.mutable_tensors(0)->set_shape(0, int64_t{1} << 40);
         m.mutable_tensors(0)->set_shape(1, int64_t{1} << 40);
       },
       "shape"},
      {"shape max", [](CheckpointMetadata& m) { m.mutable_tensors(0)->set_shape(0, kMax); },
       "shape"},
      {"shape negative", [](CheckpointMetadata& m) { m.mutable_tensors(0)->set_shape(0, -2); },
       "shape"},
      {"begin negative", [&](CheckpointMetadata& m) { chunk(m, 0)->set_begin(-1); }, "begin"},
      {"end max", [&](CheckpointMetadata& m) { chunk(m, 0)->set_end(kMax); }, "end"},
      {"end before begin", [&](CheckpointMetadata& m) { chunk(m, 0)->set_end(0); }, "end"},
      {"byte_length max", [&](CheckpointMetadata& m) { chunk(m, 0)->set_byte_length(kMax); },
       "byte_length"},
      {"byte_length short", [&](CheckpointMetadata& m) { chunk(m, 0)->set_byte_length(12); },
       "byte_length"},
      {"byte_offset max", [&](CheckpointMetadata& m) { chunk(m, 1)->set_byte_offset(kMax); },
       "byte_offset"},
      {"byte_offset + length overflows",
       [&](CheckpointMetadata& m) { chunk(m, 1)->set_byte_offset(kMax - 4); }, "byte_offset"},
      {"byte_offset negative", [&](CheckpointMetadata& m) { chunk(m, 1)->set_byte_offset(-8); },
       "byte_offset"},
      {"chunks overlap", [&](CheckpointMetadata& m) { chunk(m, 1)->set_byte_offset(8); },
       "overlaps"},
      {"bytes in no chunk",
       [&](CheckpointMetadata& m) {
         m.mutable_files(0)->set_size_bytes(32);
         chunk(m, 1)->set_byte_offset(24);
       },
       "bytes [16, 24) belong to no chunk"},
      {"trailing bytes in no chunk",
       [](CheckpointMetadata& m) { m.mutable_files(0)->set_size_bytes(25); }, "bytes [24, 25)"},
      {"checksum count", [&](CheckpointMetadata& m) { chunk(m, 0)->add_block_crc32c(4); },
       "block_crc32c"},
      {"unknown file", [&](CheckpointMetadata& m) { chunk(m, 0)->set_file("../x.bin"); }, "file"},
      {"dtype", [](CheckpointMetadata& m) { m.mutable_tensors(1)->set_dtype("float64"); }, "dtype"},
      {"duplicate name", [](CheckpointMetadata& m) { m.mutable_tensors(1)->set_name("a"); },
       "listed twice"},
      {"elements in no chunk", [](CheckpointMetadata& m) { m.mutable_tensors(1)->set_shape(0, 3); },
       "elements [2, 3) are in no chunk"},
  };
  for (const Case& c : cases) {
    CheckpointMetadata meta = Valid();
    c.mutate(meta);
    absl::StatusOr<MetadataIndex> index =
        ParseMetadataFile(EncodeMetadataFile(meta), "/ckpt", kPath);
    EXPECT_TRUE(absl::IsDataLoss(index.status())) << c.name << ": " << index.status();
    EXPECT_THAT(std::string(index.status().message()), HasSubstr(kPath)) << c.name;
    EXPECT_THAT(std::string(index.status().message()), HasSubstr(c.expect)) << c.name;
  }
}

// The fuzz target's seeds (testdata/metadata_fuzz_corpus/, written by hand to the
// format) are valid checkpoints' metadata, so fuzzing starts past the checksums.
TEST(MetadataTest, FuzzSeedsAreValidMetadata) {
  for (const char* name : {"two_ranks_metadata.pb", "one_rank_metadata.pb"}) {
    const std::string path = std::string("checkpoint/testdata/metadata_fuzz_corpus/") + name;
    std::ifstream f(path, std::ios::binary);
    ASSERT_TRUE(f.good()) << path;
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    absl::StatusOr<MetadataIndex> index = ParseMetadataFile(bytes, "seed", path);
    EXPECT_TRUE(index.ok()) << index.status();
  }
}

}  // namespace
}  // namespace internal
}  // namespace checkpoint
