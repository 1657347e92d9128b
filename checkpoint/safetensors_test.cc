#include "checkpoint/safetensors.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/module.h"
#include "core/random.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace checkpoint {
namespace {

using core::DType;
using core::Tensor;
using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/safetensors_", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string LittleEndian64(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out;
}

// A file as the reference serializer lays it out: length, header padded with spaces
// to a multiple of 8, then the buffer.
std::string File(const std::string& header, const std::string& buffer, bool pad = true) {
  std::string h = header;
  if (pad) h.append((8 - h.size() % 8) % 8, ' ');
  return LittleEndian64(h.size()) + h + buffer;
}

std::string Bytes(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw_data()), static_cast<size_t>(t.nbytes()));
}

Tensor RandomTensor(const core::Shape& shape, DType dtype, uint64_t seed) {
  Tensor t = Tensor::Empty(shape, dtype);
  core::Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = rng.Normal(0.0f, 3.0f);
    if (dtype == DType::kFloat32) t.data<float>()[i] = v;
    if (dtype == DType::kBFloat16) t.data<core::BFloat16>()[i] = core::BFloat16::FromFloat(v);
    if (dtype == DType::kInt32) t.data<int32_t>()[i] = static_cast<int32_t>(rng.NextU64());
  }
  return t;
}

NamedTensors SampleTensors() {
  NamedTensors t;
  t.emplace_back("blocks.0.attn.qkv.weight", RandomTensor({6, 4}, DType::kFloat32, 1));
  t.emplace_back("emb", RandomTensor({5, 3}, DType::kBFloat16, 2));
  t.emplace_back("ids", RandomTensor({7}, DType::kInt32, 3));
  t.emplace_back("scalar", RandomTensor({}, DType::kFloat32, 4));
  t.emplace_back("empty", RandomTensor({0, 3}, DType::kFloat32, 5));
  t.emplace_back("odd", RandomTensor({3}, DType::kBFloat16, 6));  // 6 bytes: later data unaligned
  return t;
}

// Reads the exported bytes directly and checks every rule of NOTE [Safetensors layout].
TEST(SafetensorsTest, HeaderFollowsThePublishedFormat) {
  const std::string path = TestDir("header") + "/model.safetensors";
  const NamedTensors tensors = SampleTensors();
  ASSERT_TRUE(ExportSafetensors(path, tensors, {{"format", "pt"}}).ok());
  const std::string bytes = ReadAll(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  ASSERT_LE(8 + n, bytes.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "data must start 8-byte aligned";
  const std::string header = bytes.substr(8, n);
  // Padding is spaces only, after a compact JSON object.
  const size_t last = header.find_last_not_of(' ');
  ASSERT_NE(last, std::string::npos);
  EXPECT_EQ(header[0], '{');
  EXPECT_EQ(header[last], '}');
  EXPECT_LT(header.size() - (last + 1), 8u);
  const Json j = Json::parse(header);
  EXPECT_EQ(j.dump(), header.substr(0, last + 1)) << "header is compact JSON";

  auto it = j.begin();
  ASSERT_EQ(it.key(), "__metadata__");
  EXPECT_EQ(it.value(), Json({{"format", "pt"}}));
  ++it;
  const char* dtype_names[] = {"F32", "BF16", "I32"};
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    ASSERT_NE(it, j.end());
    EXPECT_EQ(it.key(), name);
    const Json& e = it.value();
    EXPECT_EQ(e.size(), 3u) << e.dump();
    EXPECT_EQ(e["dtype"], dtype_names[static_cast<int>(t.dtype())]) << name;
    EXPECT_EQ(e["shape"].get<std::vector<int64_t>>(), t.shape()) << name;
    const auto offsets = e["data_offsets"].get<std::vector<uint64_t>>();
    ASSERT_EQ(offsets.size(), 2u);
    EXPECT_EQ(offsets[0], offset) << name << ": back to back, in the order written";
    EXPECT_EQ(offsets[1] - offsets[0], static_cast<uint64_t>(t.nbytes())) << name;
    EXPECT_EQ(bytes.substr(8 + n + offsets[0], offsets[1] - offsets[0]), Bytes(t)) << name;
    offset = offsets[1];
    ++it;
  }
  EXPECT_EQ(it, j.end());
  EXPECT_EQ(8 + n + offset, bytes.size()) << "the buffer ends with the last tensor";
  // Written atomically: nothing but the file is left in the directory.
  EXPECT_EQ(
      std::distance(std::filesystem::directory_iterator(std::filesystem::path(path).parent_path()),
                    std::filesystem::directory_iterator()),
      1);
}

TEST(SafetensorsTest, RoundTripIsBitExact) {
  const std::string path = TestDir("roundtrip") + "/m.safetensors";
  NamedTensors tensors = SampleTensors();
  // Special values survive as bits.
  Tensor special = Tensor::Empty({6});
  const float values[] = {
      std::numeric_limits<float>::quiet_NaN(), -0.0f,
      std::numeric_limits<float>::infinity(),  std::numeric_limits<float>::denorm_min(),
      std::numeric_limits<float>::max(),       -1.0f};
  std::memcpy(special.raw_data(), values, sizeof(values));
  tensors.emplace_back("special", special);
  ASSERT_TRUE(ExportSafetensors(path, tensors, {{"a", "1"}, {"b", "two"}}).ok());
  absl::StatusOr<SafetensorsFile> file = ImportSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata, (std::map<std::string, std::string>{{"a", "1"}, {"b", "two"}}));
  ASSERT_EQ(file->tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(file->tensors[i].first, tensors[i].first);
    EXPECT_EQ(file->tensors[i].second.shape(), tensors[i].second.shape()) << tensors[i].first;
    EXPECT_EQ(file->tensors[i].second.dtype(), tensors[i].second.dtype()) << tensors[i].first;
    EXPECT_EQ(Bytes(file->tensors[i].second), Bytes(tensors[i].second)) << tensors[i].first;
  }
  ASSERT_NE(file->Find("emb"), nullptr);
  EXPECT_EQ(file->Find("nope"), nullptr);

  // No tensors at all is a valid file too.
  ASSERT_TRUE(ExportSafetensors(path, {}).ok());
  file = ImportSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->tensors.empty());
  EXPECT_EQ(ReadAll(path), File("{}", ""));
}

// ParseSafetensors reads the same bytes from memory as ImportSafetensors from a file,
// and refuses the same damage with the same codes.
TEST(SafetensorsTest, ParseFromMemoryMatchesImportFromFile) {
  const std::string path = TestDir("memory") + "/m.safetensors";
  const NamedTensors tensors = SampleTensors();
  ASSERT_TRUE(ExportSafetensors(path, tensors, {{"a", "1"}}).ok());
  const std::string bytes = ReadAll(path);
  absl::StatusOr<SafetensorsFile> from_file = ImportSafetensors(path);
  absl::StatusOr<SafetensorsFile> from_memory = ParseSafetensors(bytes, "m");
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  ASSERT_TRUE(from_memory.ok()) << from_memory.status();
  EXPECT_EQ(from_memory->metadata, from_file->metadata);
  ASSERT_EQ(from_memory->tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(from_memory->tensors[i].first, tensors[i].first);
    EXPECT_EQ(Bytes(from_memory->tensors[i].second), Bytes(tensors[i].second)) << tensors[i].first;
  }
  for (size_t cut : {size_t{0}, size_t{7}, size_t{12}, bytes.size() - 1}) {
    absl::StatusOr<SafetensorsFile> cut_file = ParseSafetensors(bytes.substr(0, cut), "m");
    EXPECT_FALSE(cut_file.ok()) << cut;
    EXPECT_THAT(std::string(cut_file.status().message()), ::testing::HasSubstr("'m'")) << cut;
    WriteAll(path, bytes.substr(0, cut));
    EXPECT_EQ(ImportSafetensors(path).status().code(), cut_file.status().code()) << cut;
  }
}

// The fuzz target's seed (testdata/safetensors_fuzz_corpus/model.safetensors, written by
// hand to the published layout) is a valid file with every supported dtype.
TEST(SafetensorsTest, FuzzSeedIsAValidFile) {
  absl::StatusOr<SafetensorsFile> file =
      ImportSafetensors("checkpoint/testdata/safetensors_fuzz_corpus/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->tensors.size(), 5u);
  EXPECT_EQ(file->metadata.at("format"), "pt");
}

// The bytes safetensors.torch.save_file writes for
//   {"linear.weight": torch.tensor([[1.0, -2.5], [0.5, 3.0]]),
//    "steps": torch.tensor([7], dtype=torch.int32),
//    "emb": torch.tensor([1.0, -0.5, 2.0], dtype=torch.bfloat16)}, metadata={"format": "pt"}:
// the reference serializer orders tensors by dtype (F32, I32, BF16 here: descending in
// its Dtype enum) then name, writes compact JSON with "__metadata__" first and each
// entry's keys as dtype, shape, data_offsets, and pads with spaces to 8 bytes.
TEST(SafetensorsTest, ReadsAFileAsPyTorchWritesIt) {
  const std::string path = TestDir("pytorch") + "/pt.safetensors";
  const std::string header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("linear.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("steps":{"dtype":"I32","shape":[1],"data_offsets":[16,20]},)"
      R"("emb":{"dtype":"BF16","shape":[3],"data_offsets":[20,26]}})";
  const std::string buffer = std::string(
      "\x00\x00\x80\x3f"  // 1.0f
      "\x00\x00\x20\xc0"  // -2.5f
      "\x00\x00\x00\x3f"  // 0.5f
      "\x00\x00\x40\x40"  // 3.0f
      "\x07\x00\x00\x00"  // int32 7
      "\x80\x3f"          // bf16 1.0
      "\x00\xbf"          // bf16 -0.5
      "\x00\x40",         // bf16 2.0
      26);
  ASSERT_EQ(header.size() % 8, 1u);  // so the file has 7 bytes of space padding
  const std::string bytes = File(header, buffer);
  ASSERT_EQ(bytes.substr(8 + header.size(), 7), std::string(7, ' '));
  WriteAll(path, bytes);
  absl::StatusOr<SafetensorsFile> file = ImportSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata.at("format"), "pt");
  ASSERT_EQ(file->tensors.size(), 3u);
  EXPECT_EQ(file->tensors[0].first, "linear.weight");
  EXPECT_EQ(file->tensors[0].second.shape(), (core::Shape{2, 2}));
  EXPECT_EQ(file->tensors[0].second.ToVector(), (std::vector<float>{1.0f, -2.5f, 0.5f, 3.0f}));
  EXPECT_EQ(file->tensors[1].first, "steps");
  EXPECT_EQ(file->tensors[1].second.dtype(), DType::kInt32);
  EXPECT_EQ(file->tensors[1].second.data<int32_t>()[0], 7);
  EXPECT_EQ(file->tensors[2].first, "emb");
  EXPECT_EQ(file->tensors[2].second.dtype(), DType::kBFloat16);
  EXPECT_EQ(file->tensors[2].second.ToVector(), (std::vector<float>{1.0f, -0.5f, 2.0f}));

  // Exporting the same tensors, in the same order, reproduces the file byte for byte.
  const std::string again = path + ".again";
  ASSERT_TRUE(ExportSafetensors(again, file->tensors, {{"format", "pt"}}).ok());
  EXPECT_EQ(ReadAll(again), bytes);
}

// F16 tensors (many published checkpoints) are read widened to F32, every value exact: normals,
// the largest half, subnormals, signed zero, infinities and NaN.
TEST(SafetensorsTest, ReadsF16WidenedExactlyToF32) {
  const std::string path = TestDir("f16") + "/half.safetensors";
  const std::string header = R"({"h":{"dtype":"F16","shape":[2,4],"data_offsets":[0,16]},)"
                             R"("f":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}})";
  const std::string buffer = std::string(
      "\x00\x3c"           // 1.0
      "\x00\xc1"           // -2.5
      "\xff\x7b"           // 65504, the largest half
      "\x01\x00"           // 2^-24, the smallest subnormal
      "\x00\x02"           // 2^-15, a subnormal
      "\x00\x80"           // -0.0
      "\x00\xfc"           // -inf
      "\x00\x7e"           // NaN
      "\x00\x00\x80\x3f",  // f32 1.0
      20);
  WriteAll(path, File(header, buffer));
  for (bool streamed : {false, true}) {
    SCOPED_TRACE(streamed ? "SafetensorsReader" : "ImportSafetensors");
    core::Tensor h;
    if (streamed) {
      absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
      ASSERT_TRUE(reader.ok()) << reader.status();
      absl::StatusOr<core::Tensor> read = reader->Read("h");
      ASSERT_TRUE(read.ok()) << read.status();
      h = *read;
    } else {
      absl::StatusOr<SafetensorsFile> file = ImportSafetensors(path);
      ASSERT_TRUE(file.ok()) << file.status();
      ASSERT_NE(file->Find("h"), nullptr);
      h = *file->Find("h");
      EXPECT_EQ(file->Find("f")->ToVector(), std::vector<float>{1.0f});
      EXPECT_EQ(file->stored_dtypes, (std::vector<std::string>{"F16", "F32"}));
    }
    EXPECT_EQ(h.dtype(), DType::kFloat32);
    EXPECT_EQ(h.shape(), (core::Shape{2, 4}));
    const std::vector<float> v = h.ToVector();
    EXPECT_EQ(v[0], 1.0f);
    EXPECT_EQ(v[1], -2.5f);
    EXPECT_EQ(v[2], 65504.0f);
    EXPECT_EQ(v[3], std::ldexp(1.0f, -24));
    EXPECT_EQ(v[4], std::ldexp(1.0f, -15));
    EXPECT_EQ(v[5], 0.0f);
    EXPECT_TRUE(std::signbit(v[5]));
    EXPECT_EQ(v[6], -std::numeric_limits<float>::infinity());
    EXPECT_TRUE(std::isnan(v[7]));
  }
}

// Older writers list header keys in any order (by name, say); the reader orders by offset.
TEST(SafetensorsTest, HeaderKeysInAnyOrderAreReadInOffsetOrder) {
  const std::string path = TestDir("order") + "/o.safetensors";
  WriteAll(path, File(R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                      std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8), /*pad=*/false));
  absl::StatusOr<SafetensorsFile> file = ImportSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tensors.size(), 2u);
  EXPECT_EQ(file->tensors[0].first, "a");
  EXPECT_EQ(file->tensors[0].second.ToVector()[0], 1.0f);
  EXPECT_EQ(file->tensors[1].first, "b");
  EXPECT_EQ(file->tensors[1].second.ToVector()[0], 2.0f);
}

struct BadFile {
  std::string name;
  std::string bytes;
  absl::StatusCode code;
  std::vector<std::string> mentions;  // besides the file path
};

// A header entry of one tensor.
std::string Entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return absl::StrCat("\"", name, "\":{\"dtype\":\"", dtype, "\",\"shape\":", shape,
                      ",\"data_offsets\":", offsets, "}");
}

// Files that ImportSafetensors must refuse, each with the code and words of its error.
std::vector<BadFile> MalformedFiles() {
  const std::string f8(8, '\0');
  return {
      {"short",
       std::string("\x05\x00\x00", 3),
       absl::StatusCode::kInvalidArgument,
       {"fewer than the 8"}},
      {"huge_header",
       LittleEndian64(100000001) + "{}",
       absl::StatusCode::kInvalidArgument,
       {"exceeds"}},
      {"header_past_end",
       LittleEndian64(64) + "{}      ",
       absl::StatusCode::kInvalidArgument,
       {"past the end"}},
      {"not_json", File("{\"a\": ", ""), absl::StatusCode::kInvalidArgument, {"not valid JSON"}},
      {"not_object", File("[1, 2]", ""), absl::StatusCode::kInvalidArgument, {"start with '{'"}},
      {"unknown_dtype",
       File("{" + Entry("w", "Q7", "[2]", "[0,8]") + "}", f8),
       absl::StatusCode::kInvalidArgument,
       {"'w'", "'Q7'"}},
      {"unsupported_dtype",
       File("{" + Entry("w", "F64", "[1]", "[0,8]") + "}", f8),
       absl::StatusCode::kUnimplemented,
       {"'w'", "'F64'"}},
      {"f16_size_mismatch",
       File("{" + Entry("w", "F16", "[3]", "[0,8]") + "}", f8),
       absl::StatusCode::kInvalidArgument,
       {"'w'", "6 bytes"}},
      {"size_mismatch",
       File("{" + Entry("w", "F32", "[3]", "[0,8]") + "}", f8),
       absl::StatusCode::kInvalidArgument,
       {"'w'", "12 bytes"}},
      {"overlap",
       File("{" + Entry("a", "F32", "[1]", "[0,4]") + "," + Entry("b", "F32", "[1]", "[2,6]") + "}",
            std::string(6, '\0')),
       absl::StatusCode::kInvalidArgument,
       {"'b'", "overlap", "'a'"}},
      {"gap",
       File(
           "{" + Entry("a", "F32", "[1]", "[0,4]") + "," + Entry("b", "F32", "[1]", "[8,12]") + "}",
           std::string(12, '\0')),
       absl::StatusCode::kInvalidArgument,
       {"'b'", "gap"}},
      {"not_from_zero",
       File("{" + Entry("a", "F32", "[1]", "[4,8]") + "}", f8),
       absl::StatusCode::kInvalidArgument,
       {"'a'", "gap"}},
      {"truncated",
       File(
           "{" + Entry("a", "F32", "[1]", "[0,4]") + "," + Entry("b", "F32", "[2]", "[4,12]") + "}",
           f8),
       absl::StatusCode::kDataLoss,
       {"'b'", "truncated"}},
      {"trailing",
       File("{" + Entry("a", "F32", "[1]", "[0,4]") + "}", f8),
       absl::StatusCode::kInvalidArgument,
       {"4 bytes follow"}},
      {"duplicate",
       File("{" + Entry("a", "F32", "[1]", "[0,4]") + "," + Entry("a", "F32", "[1]", "[4,8]") + "}",
            f8),
       absl::StatusCode::kInvalidArgument,
       {"'a'", "twice"}},
      {"negative_offset",
       File("{" + Entry("a", "F32", "[1]", "[-4,0]") + "}", ""),
       absl::StatusCode::kInvalidArgument,
       {"'a'", "non-negative"}},
      {"float_shape",
       File("{" + Entry("a", "F32", "[1.5]", "[0,4]") + "}", std::string(4, '\0')),
       absl::StatusCode::kInvalidArgument,
       {"'a'", "shape"}},
      {"reversed_offsets",
       File("{" + Entry("a", "F32", "[0]", "[4,0]") + "}", ""),
       absl::StatusCode::kInvalidArgument,
       {"'a'", "end before"}},
      {"missing_key",
       File(R"({"a":{"dtype":"F32","shape":[1]}})", std::string(4, '\0')),
       absl::StatusCode::kInvalidArgument,
       {"'a'", "data_offsets"}},
      {"bad_metadata",
       File(R"({"__metadata__":{"k":1}})", ""),
       absl::StatusCode::kInvalidArgument,
       {"__metadata__", "'k'"}},
      {"huge_shape",
       File("{" + Entry("a", "F32", "[1099511627776,1099511627776]", "[0,4]") + "}", ""),
       absl::StatusCode::kInvalidArgument,
       {"'a'", "2^50"}},
  };
}

TEST(SafetensorsTest, MalformedFilesAreRefusedNamingFileAndTensor) {
  const std::string dir = TestDir("bad");
  for (const BadFile& c : MalformedFiles()) {
    const std::string path = absl::StrCat(dir, "/", c.name, ".safetensors");
    WriteAll(path, c.bytes);
    absl::StatusOr<SafetensorsFile> file = ImportSafetensors(path);
    EXPECT_EQ(file.status().code(), c.code) << c.name << ": " << file.status();
    const std::string msg(file.status().message());
    EXPECT_THAT(msg, HasSubstr(path)) << c.name;
    for (const std::string& m : c.mentions) EXPECT_THAT(msg, HasSubstr(m)) << c.name;
  }
  absl::StatusOr<SafetensorsFile> missing = ImportSafetensors(dir + "/missing.safetensors");
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr(dir + "/missing.safetensors"));
}

TEST(SafetensorsTest, ExportRefusesBadNamesAndTensors) {
  const std::string dir = TestDir("export_bad");
  const std::string path = dir + "/x.safetensors";
  const Tensor t = Tensor::Zeros({2});
  struct Case {
    NamedTensors tensors;
    std::string mention;
  };
  const std::vector<Case> cases = {
      {{{"", t}}, "empty name"},
      {{{"a", t}, {"a", t}}, "'a' is listed twice"},
      {{{"__metadata__", t}}, "reserved"},
      {{{"u", Tensor()}}, "'u' is undefined"},
      {{{std::string("bad\xff"), t}}, "UTF-8"},
  };
  for (const Case& c : cases) {
    absl::Status s = ExportSafetensors(path, c.tensors);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << c.mention << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.mention));
    EXPECT_THAT(std::string(s.message()), HasSubstr(path));
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "nothing written, no temporaries left";
  absl::Status s = ExportSafetensors(dir + "/no/such/dir/x.safetensors", {{"a", t}});
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr(dir + "/no/such/dir/x.safetensors"));
}

// A two-level module with a tied parameter, enough to check names and ties.
class Leaf : public core::Module {
 public:
  Leaf(const core::Shape& shape, uint64_t seed) {
    w_ = RegisterParameter("weight", RandomTensor(shape, DType::kFloat32, seed));
  }
  explicit Leaf(core::ParameterPtr tied) { w_ = RegisterParameter("weight", std::move(tied)); }
  std::string TypeName() const override { return "Leaf"; }
  const core::ParameterPtr& weight() const { return w_; }

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor& x) override { return x; }
  absl::StatusOr<Tensor> BackwardImpl(const Tensor& g) override { return g; }

 private:
  core::ParameterPtr w_;
};

class Net : public core::Module {
 public:
  explicit Net(uint64_t seed) {
    RegisterParameter("scale", RandomTensor({3}, DType::kBFloat16, seed));
    a_ = RegisterModule("a", std::make_shared<Leaf>(core::Shape{4, 3}, seed + 1));
    b_ = RegisterModule("b", std::make_shared<Leaf>(core::Shape{2}, seed + 2));
    tied_ = RegisterModule("tied", std::make_shared<Leaf>(a_->weight()));
  }
  std::string TypeName() const override { return "Net"; }
  std::shared_ptr<Leaf> a_, b_, tied_;

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor& x) override { return x; }
  absl::StatusOr<Tensor> BackwardImpl(const Tensor& g) override { return g; }
};

TEST(SafetensorsTest, ModuleExportUsesNamedParametersAndImportsBack) {
  const std::string path = TestDir("module") + "/net.safetensors";
  auto net = std::make_shared<Net>(10);
  ASSERT_TRUE(ExportSafetensors(path, *net, {{"format", "pt"}}, ParameterShapes(*net)).ok());
  absl::StatusOr<SafetensorsFile> file = ImportSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const auto params = net->NamedParameters();
  ASSERT_EQ(file->tensors.size(), params.size());  // the tied weight once
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(file->tensors[i].first, params[i].first);
    EXPECT_EQ(Bytes(file->tensors[i].second), Bytes(params[i].second->data)) << params[i].first;
  }

  auto other = std::make_shared<Net>(99);
  ASSERT_TRUE(ImportSafetensorsInto(path, *other).ok());
  for (const auto& [name, p] : other->NamedParameters()) {
    EXPECT_EQ(Bytes(p->data), Bytes(*file->Find(name))) << name;
  }
  EXPECT_TRUE(other->tied_->weight() == other->a_->weight()) << "ties are kept";
}

TEST(SafetensorsTest, ModuleExportRefusesShardedParameters) {
  const std::string dir = TestDir("module_sharded");
  auto net = std::make_shared<Net>(3);
  const auto shapes = ParameterShapes(*net);
  // As FSDP leaves it: a parameter's data is a 1-D slice of its flattened elements.
  net->a_->weight()->data = net->a_->weight()->data.Flat().View(0, {6}).value();
  absl::Status s = ExportSafetensors(dir + "/x.safetensors", *net, {}, shapes);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("'a.weight'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("[4, 3]"));
  EXPECT_TRUE(std::filesystem::is_empty(dir));

  net->b_->weight()->data = Tensor();
  s = ExportSafetensors(dir + "/x.safetensors", *net);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("'b.weight'"));
}

TEST(SafetensorsTest, ImportIntoChecksEverythingBeforeChangingAnything) {
  const std::string dir = TestDir("into");
  auto net = std::make_shared<Net>(1);
  // A file whose b.weight has the wrong shape.
  NamedTensors tensors;
  for (const auto& [name, p] : net->NamedParameters())
    tensors.emplace_back(name, p->data.Clone(core::MemoryTag::kOther));
  tensors[0].second.Fill(5.0f);  // "scale": would change if import went ahead
  tensors.back().second = Tensor::Zeros({3});
  ASSERT_TRUE(ExportSafetensors(dir + "/wrong.safetensors", tensors).ok());
  const std::string before = Bytes(net->NamedParameters()[0].second->data);
  absl::Status s = ImportSafetensorsInto(dir + "/wrong.safetensors", *net);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("'b.weight'"));
  EXPECT_EQ(Bytes(net->NamedParameters()[0].second->data), before);

  // Missing a parameter; an extra tensor under strict.
  ASSERT_TRUE(ExportSafetensors(dir + "/partial.safetensors", {tensors[0]}).ok());
  s = ImportSafetensorsInto(dir + "/partial.safetensors", *net);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("'a.weight'"));
  tensors.back().second = Tensor::Zeros({2});
  tensors.emplace_back("extra", Tensor::Zeros({1}));
  ASSERT_TRUE(ExportSafetensors(dir + "/extra.safetensors", tensors).ok());
  s = ImportSafetensorsInto(dir + "/extra.safetensors", *net);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("'extra'"));
  s = ImportSafetensorsInto(dir + "/extra.safetensors", *net, /*strict=*/false);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(net->NamedParameters()[0].second->data.ToVector(),
            (std::vector<float>{5.0f, 5.0f, 5.0f}));
}

}  // namespace
}  // namespace checkpoint
