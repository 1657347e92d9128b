#include "checkpoint/testing/sharded_model.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "checkpoint/internal/metadata.h"
#include "comm/testing/thread_ranks.h"
#include "core/random.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"

namespace checkpoint {
namespace testing {

using core::DType;
using core::Tensor;

namespace {

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

// Deterministic contents derived from the name and `version`.
Tensor MakeFull(const Spec& spec, int version) {
  Tensor t = Tensor::Empty(spec.shape, spec.dtype);
  core::Rng rng(Fnv1a(spec.name) + static_cast<uint64_t>(version));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = rng.Normal(0.0f, 1.0f);
    if (spec.dtype == DType::kFloat32) t.data<float>()[i] = v;
    if (spec.dtype == DType::kBFloat16) t.data<core::BFloat16>()[i] = core::BFloat16::FromFloat(v);
    if (spec.dtype == DType::kInt32)
      t.data<int32_t>()[i] = static_cast<int32_t>(rng.NextU64() % 100000);
  }
  return t;
}

Model MakeModel(int version) {
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

absl::Status SaveAt(int world, const std::string& dir, const Model& m, const SaveOptions& options) {
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

}  // namespace testing
}  // namespace checkpoint
