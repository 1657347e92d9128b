#include "flatten/flat_parameter.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/parameter.h"
#include "core/random.h"
#include "core/tensor.h"
#include "flatten/shard_math.h"
#include "gtest/gtest.h"

namespace flatten {
namespace {

using core::DType;
using core::MemoryTag;
using core::Tensor;

// A model description from which identical copies of the same parameters are built,
// one per simulated rank. `entries` lists (name, index into `params`); an index that
// appeared before is a tied parameter under a second name. Distinct parameters appear
// in `params` in order of first use, so their concatenation is the expected flat layout.
struct ParamSpec {
  core::Shape shape;
  std::vector<float> values;
  bool requires_grad = true;
};
struct ModelSpec {
  std::vector<ParamSpec> params;
  std::vector<std::pair<std::string, int>> entries;

  // Fresh Parameter objects (fp32, tag kParam) holding the spec's values.
  std::vector<core::NamedParameter> Build() const {
    std::vector<core::ParameterPtr> objects;
    for (const ParamSpec& spec : params) {
      Tensor t = Tensor::Empty(spec.shape, DType::kFloat32, MemoryTag::kParam);
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = spec.values[i];
      objects.push_back(core::Parameter::Make(t, spec.requires_grad));
    }
    std::vector<core::NamedParameter> named;
    for (const auto& [name, index] : entries) named.emplace_back(name, objects[index]);
    return named;
  }

  int64_t numel() const {
    int64_t n = 0;
    for (const ParamSpec& p : params) n += static_cast<int64_t>(p.values.size());
    return n;
  }

  // The concatenated values, right-padded with zeros to a multiple of `world`, built
  // directly from the spec (not from the code under test).
  std::vector<float> PaddedBuffer(int world) const {
    std::vector<float> out;
    for (const ParamSpec& p : params) out.insert(out.end(), p.values.begin(), p.values.end());
    while (out.size() % world != 0) out.push_back(0.0f);
    return out;
  }
};

// 1 to 7 parameters of rank 0 to 3, dims 0 to 5 (so some are empty and some scalars),
// about a quarter frozen, and now and then a tied second name for an earlier one.
ModelSpec RandomModel(core::Rng& rng) {
  ModelSpec model;
  const int num = 1 + static_cast<int>(rng.UniformInt(7));
  for (int i = 0; i < num; ++i) {
    ParamSpec spec;
    const int rank = static_cast<int>(rng.UniformInt(4));
    for (int d = 0; d < rank; ++d) spec.shape.push_back(static_cast<int64_t>(rng.UniformInt(6)));
    spec.requires_grad = rng.UniformInt(4) != 0;
    const int64_t n = core::NumElements(spec.shape);
    for (int64_t k = 0; k < n; ++k) spec.values.push_back(rng.Uniform(-1.0f, 1.0f));
    model.params.push_back(std::move(spec));
    model.entries.emplace_back("layer" + std::to_string(i) + ".w", i);
    if (i > 0 && rng.UniformInt(5) == 0) {
      model.entries.emplace_back("tied" + std::to_string(i), static_cast<int>(rng.UniformInt(i)));
    }
  }
  return model;
}

std::vector<float> Slice(const std::vector<float>& v, int64_t begin, int64_t end) {
  return std::vector<float>(v.begin() + begin, v.begin() + end);
}

bool Contains(const absl::Status& s, const std::string& text) {
  return s.message().find(text) != absl::string_view::npos;
}

// Every test counts with its own allocator, so nothing else in the process disturbs the
// figures; all tensors (including the test's own) are allocated from it.
class FlatParameterTest : public ::testing::Test {
 protected:
  // Builds rank r's FlatParameter for r = 0..world-1, each from its own copy of `model`.
  std::vector<std::unique_ptr<FlatParameter>> FlattenAllRanks(
      const ModelSpec& model, int world, std::vector<std::vector<core::NamedParameter>>* copies) {
    std::vector<std::unique_ptr<FlatParameter>> flats;
    for (int r = 0; r < world; ++r) {
      copies->push_back(model.Build());
      absl::StatusOr<std::unique_ptr<FlatParameter>> flat =
          FlatParameter::Flatten(copies->back(), world, r);
      EXPECT_TRUE(flat.ok()) << flat.status();
      flats.push_back(*std::move(flat));
    }
    return flats;
  }

  // Stands in for fsdp's all-gather: allocates every rank's full buffer in `dtype` and
  // copies (converting) each rank's shard into its chunk.
  static void GatherAll(const std::vector<std::unique_ptr<FlatParameter>>& flats, DType dtype) {
    for (const auto& flat : flats) {
      ASSERT_TRUE(flat->AllocateFull(dtype).ok());
      for (const auto& source : flats) {
        Tensor chunk = flat->full()
                           .View(source->rank() * source->shard_numel(), {source->shard_numel()})
                           .value();
        ASSERT_TRUE(chunk.CopyFrom(source->shard()).ok());
      }
      ASSERT_TRUE(flat->MarkFullFilled().ok());
    }
  }

  std::shared_ptr<core::Allocator> alloc_ = std::make_shared<core::Allocator>(core::Device::Cpu());
  core::ScopedAllocator scope_{alloc_};
};

TEST_F(FlatParameterTest, ConcatenatedShardsAreThePaddedBuffer) {
  core::Rng rng(101);
  for (int trial = 0; trial < 12; ++trial) {
    const ModelSpec model = RandomModel(rng);
    for (int world = 1; world <= 8; ++world) {
      std::vector<std::vector<core::NamedParameter>> copies;
      auto flats = FlattenAllRanks(model, world, &copies);
      const std::vector<float> expected = model.PaddedBuffer(world);
      std::vector<float> concatenated;
      for (const auto& flat : flats) {
        ASSERT_EQ(flat->shard().numel(), flat->shard_numel());
        const std::vector<float> shard = flat->shard().ToVector();
        concatenated.insert(concatenated.end(), shard.begin(), shard.end());
        EXPECT_EQ(flat->full().ToVector(), expected) << "rank " << flat->rank();
        EXPECT_EQ(flat->numel(), model.numel());
        EXPECT_EQ(flat->padded_numel(), static_cast<int64_t>(expected.size()));
      }
      EXPECT_EQ(concatenated, expected) << "trial " << trial << " world " << world;
    }
  }
}

TEST_F(FlatParameterTest, RecordsDescribeLayoutAndShardSlices) {
  core::Rng rng(102);
  for (int trial = 0; trial < 12; ++trial) {
    const ModelSpec model = RandomModel(rng);
    const int world = 1 + static_cast<int>(rng.UniformInt(8));
    std::vector<std::vector<core::NamedParameter>> copies;
    auto flats = FlattenAllRanks(model, world, &copies);
    for (const auto& flat : flats) {
      const std::vector<ParamRecord>& records = flat->records();
      ASSERT_EQ(records.size(), model.params.size());
      ASSERT_EQ(flat->params().size(), model.params.size());
      int64_t offset = 0;
      for (size_t i = 0; i < records.size(); ++i) {
        const ParamRecord& rec = records[i];
        const ParamSpec& spec = model.params[i];
        EXPECT_EQ(rec.name, "layer" + std::to_string(i) + ".w");  // first name, not "tied.."
        EXPECT_EQ(rec.shape, spec.shape);
        EXPECT_EQ(rec.numel, static_cast<int64_t>(spec.values.size()));
        EXPECT_EQ(rec.offset, offset);
        EXPECT_EQ(rec.requires_grad, spec.requires_grad);
        EXPECT_EQ(flat->FindRecord(rec.name), &rec);
        offset += rec.numel;
        ASSERT_EQ(static_cast<int>(rec.shards.size()), world);
        EXPECT_EQ(rec.shards, ShardSlices(rec.offset, rec.numel, flat->numel(), world).value());
        // The slice of rank r says where r's shard holds which elements.
        for (int r = 0; r < world; ++r) {
          const ShardSlice& s = rec.shards[r];
          const std::vector<float> shard = flats[r]->shard().ToVector();
          EXPECT_EQ(Slice(shard, s.shard_offset, s.shard_offset + s.numel()),
                    Slice(spec.values, s.begin, s.end))
              << rec.name << " rank " << r << " " << SliceToString(s);
        }
      }
    }
  }
}

TEST_F(FlatParameterTest, ValuesSurviveShardFullUnflattenAndViewsAlias) {
  core::Rng rng(103);
  for (int trial = 0; trial < 8; ++trial) {
    const ModelSpec model = RandomModel(rng);
    for (int world = 1; world <= 8; ++world) {
      std::vector<std::vector<core::NamedParameter>> copies;
      auto flats = FlattenAllRanks(model, world, &copies);
      // Sharded: each parameter is its 1-D slice of the local shard.
      for (const auto& flat : flats) {
        ASSERT_TRUE(flat->ShardViews().ok());
        for (size_t i = 0; i < flat->records().size(); ++i) {
          const ParamRecord& rec = flat->records()[i];
          const ShardSlice& s = rec.shards[flat->rank()];
          const Tensor& data = flat->params()[i]->data;
          EXPECT_EQ(data.shape(), (core::Shape{s.numel()}));
          EXPECT_TRUE(data.SharesStorage(flat->shard())) << rec.name;
          EXPECT_EQ(data.raw_data(), flat->shard().data<float>() + s.shard_offset);
          EXPECT_EQ(data.ToVector(), Slice(model.params[i].values, s.begin, s.end));
        }
        ASSERT_TRUE(flat->FreeFull().ok());
        EXPECT_FALSE(flat->full().defined());
      }
      // Unsharded again from the shards alone: full-shape views of the full buffer.
      GatherAll(flats, DType::kFloat32);
      std::vector<Tensor> old_full;
      for (const auto& flat : flats) {
        ASSERT_TRUE(flat->FullViews().ok());
        old_full.push_back(flat->full());
        for (size_t i = 0; i < flat->records().size(); ++i) {
          const ParamRecord& rec = flat->records()[i];
          const Tensor& data = flat->params()[i]->data;
          EXPECT_EQ(data.shape(), rec.shape);
          EXPECT_TRUE(data.SharesStorage(flat->full())) << rec.name;
          EXPECT_EQ(data.raw_data(), flat->full().data<float>() + rec.offset);
          EXPECT_EQ(data.ToVector(), model.params[i].values);
        }
      }
      // Unflattened: each parameter has its own storage with the same values; a tied
      // name still refers to the same object.
      for (size_t r = 0; r < flats.size(); ++r) {
        std::vector<core::ParameterPtr> objects = flats[r]->params();
        ASSERT_TRUE(flats[r]->Unflatten().ok());
        EXPECT_TRUE(flats[r]->unflattened());
        EXPECT_TRUE(flats[r]->params().empty());
        EXPECT_FALSE(flats[r]->full().defined());
        EXPECT_FALSE(flats[r]->shard().defined());
        for (size_t i = 0; i < objects.size(); ++i) {
          const Tensor& data = objects[i]->data;
          EXPECT_EQ(data.shape(), model.params[i].shape);
          EXPECT_EQ(data.ToVector(), model.params[i].values);
          EXPECT_FALSE(data.SharesStorage(old_full[r]));
          EXPECT_EQ(data.storage()->tag(), MemoryTag::kParam);
          for (size_t j = 0; j < i; ++j) EXPECT_FALSE(data.SharesStorage(objects[j]->data));
        }
        // The managed objects are the caller's own, tied names included.
        for (size_t e = 0; e < model.entries.size(); ++e) {
          EXPECT_EQ(copies[r][e].second, objects[model.entries[e].second]) << copies[r][e].first;
        }
      }
    }
  }
}

TEST_F(FlatParameterTest, TiedParameterAppearsOnceUnderItsFirstName) {
  core::ParameterPtr shared = core::Parameter::Make(Tensor::FromVector({1, 2, 3}, {3}).value());
  core::ParameterPtr other = core::Parameter::Make(Tensor::FromVector({4}, {1}).value());
  std::vector<core::NamedParameter> params = {
      {"wte.weight", shared},
      {"ln.weight", other},
      {"lm_head.weight", shared},
      {"wte.weight", shared}};  // the same entry twice is harmless as well
  auto flat = FlatParameter::Flatten(params, 2, 0).value();
  ASSERT_EQ(flat->records().size(), 2u);
  EXPECT_EQ(flat->records()[0].name, "wte.weight");
  EXPECT_EQ(flat->records()[1].offset, 3);
  EXPECT_EQ(flat->numel(), 4);
  EXPECT_EQ(flat->FindRecord("lm_head.weight"), nullptr);
  EXPECT_EQ(flat->params()[0], shared);
  EXPECT_EQ(flat->full().ToVector(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_TRUE(shared->data.SharesStorage(flat->full()));
}

TEST_F(FlatParameterTest, AllocationCountersFlattenOnceViewsNothing) {
  core::Rng rng(104);
  for (int trial = 0; trial < 10; ++trial) {
    const ModelSpec model = RandomModel(rng);
    const int world = 1 + static_cast<int>(rng.UniformInt(8));
    const int rank = static_cast<int>(rng.UniformInt(world));
    std::vector<core::NamedParameter> params = model.Build();
    const core::MemoryStats before = alloc_->Stats();
    const int64_t original_bytes = model.numel() * 4;
    ASSERT_EQ(before.current_total, original_bytes);
    alloc_->ResetPeaks();

    auto flat = FlatParameter::Flatten(params, world, rank).value();
    const int64_t full_bytes = flat->padded_numel() * 4;
    const int64_t shard_bytes = flat->shard_numel() * 4;
    core::MemoryStats s = alloc_->Stats();
    // Exactly two blocks are added (full buffer and shard) while the originals are alive;
    // afterwards the originals (one block per distinct parameter) are gone because
    // nothing else refers to them.
    EXPECT_EQ(s.peak_total, original_bytes + full_bytes + shard_bytes);
    EXPECT_EQ(s.current(MemoryTag::kParam), full_bytes + shard_bytes);
    EXPECT_EQ(s.current_total, full_bytes + shard_bytes);
    // core::Allocator counts freeing a 0-byte block as an allocation (Count's
    // `delta >= 0 ? 1 : -1`; reported), so the live-block count is exact only when no
    // zero-numel original was freed.
    bool any_empty = false;
    for (const ParamSpec& p : model.params) any_empty |= p.values.empty();
    const int64_t originals = static_cast<int64_t>(model.params.size());
    if (!any_empty) {
      EXPECT_EQ(s.num_allocations - before.num_allocations, 2 - originals);
    }
    // Each parameter was copied in once, then the local chunk into the shard.
    EXPECT_EQ(flat->bytes_copied(), original_bytes + shard_bytes);

    // Switching views, data and grads, allocates and copies nothing.
    ASSERT_TRUE(flat->AllocateFullGrad(DType::kFloat32).ok());
    ASSERT_TRUE(flat->AllocateShardGrad().ok());
    s = alloc_->Stats();
    EXPECT_EQ(s.current(MemoryTag::kGrad), full_bytes + shard_bytes);
    alloc_->ResetPeaks();
    const core::MemoryStats steady = alloc_->Stats();
    const int64_t copied = flat->bytes_copied();
    for (int round = 0; round < 3; ++round) {
      ASSERT_TRUE(flat->ShardViews().ok());
      ASSERT_TRUE(flat->FullViews().ok());
      ASSERT_TRUE(flat->FullGradViews().ok());
      for (const core::ParameterPtr& p : flat->params()) {
        if (p->requires_grad) {
          ASSERT_TRUE(p->EnsureGrad().ok());  // the views fit: no new gradient
        }
      }
      ASSERT_TRUE(flat->ShardGradViews().ok());
      ASSERT_TRUE(flat->ClearGradViews().ok());
    }
    s = alloc_->Stats();
    EXPECT_EQ(s.peak_total, steady.current_total) << "a view switch allocated";
    EXPECT_EQ(s.current_total, steady.current_total);
    EXPECT_EQ(s.num_allocations, steady.num_allocations);
    EXPECT_EQ(flat->bytes_copied(), copied);

    // The sharded steady state holds only the shard; a bf16 full buffer costs 2 bytes
    // per padded element.
    ASSERT_TRUE(flat->ShardViews().ok());
    ASSERT_TRUE(flat->FreeFull().ok());
    ASSERT_TRUE(flat->FreeFullGrad().ok());
    ASSERT_TRUE(flat->FreeShardGrad().ok());
    s = alloc_->Stats();
    EXPECT_EQ(s.current_total, shard_bytes);
    ASSERT_TRUE(flat->AllocateFull(DType::kBFloat16).ok());
    EXPECT_EQ(alloc_->Stats().current(MemoryTag::kParam), shard_bytes + flat->padded_numel() * 2);
  }
}

TEST_F(FlatParameterTest, WritesThroughViewsReachTheBuffers) {
  std::vector<core::NamedParameter> params = {
      {"a", core::Parameter::Make(Tensor::FromVector({1, 2, 3, 4, 5}, {5}).value())},
      {"b", core::Parameter::Make(Tensor::FromVector({6, 7, 8}, {3}).value())}};
  auto flat = FlatParameter::Flatten(params, 3, 1).value();  // shard: a[3], a[4], b[0]
  ASSERT_TRUE(flat->ShardViews().ok());
  params[1].second->data.data<float>()[0] = 70.0f;  // b[0] through its shard view
  EXPECT_EQ(flat->shard().ToVector()[2], 70.0f);
  ASSERT_TRUE(flat->FullViews().ok());
  params[0].second->data.data<float>()[4] = 50.0f;  // a[4] through its full view
  EXPECT_EQ(flat->full().ToVector()[4], 50.0f);
  // The full buffer does not see the shard write until the two are synchronised.
  EXPECT_EQ(flat->full().ToVector()[5], 6.0f);
  ASSERT_TRUE(flat->CopyFullToShard().ok());
  EXPECT_EQ(flat->shard().ToVector(), (std::vector<float>{4, 50, 6}));
}

TEST_F(FlatParameterTest, FrozenAndZeroNumelParameters) {
  std::vector<core::NamedParameter> params = {
      {"w", core::Parameter::Make(Tensor::FromVector({1, 2, 3, 4, 5, 6}, {2, 3}).value())},
      {"empty", core::Parameter::Make(Tensor::Zeros({0}, DType::kFloat32, MemoryTag::kParam))},
      {"frozen", core::Parameter::Make(Tensor::FromVector({7, 8, 9}, {3}).value(), false)},
      {"empty3d",
       core::Parameter::Make(Tensor::Zeros({3, 0, 2}, DType::kFloat32, MemoryTag::kParam))},
      {"scalar", core::Parameter::Make(Tensor::FromVector({10}, {}).value())}};
  const int world = 4;  // 10 elements padded to 12, shards of 3
  std::vector<std::unique_ptr<FlatParameter>> flats;
  std::vector<std::vector<core::NamedParameter>> copies;
  for (int r = 0; r < world; ++r) {
    copies.emplace_back();
    for (const auto& [name, p] : params) {
      copies.back().emplace_back(
          name, core::Parameter::Make(p->data.Clone(MemoryTag::kParam), p->requires_grad));
    }
    flats.push_back(FlatParameter::Flatten(copies.back(), world, r).value());
  }
  EXPECT_EQ(flats[0]->padded_numel(), 12);
  for (int r = 0; r < world; ++r) {
    FlatParameter& flat = *flats[r];
    const auto& ps = copies[r];
    EXPECT_EQ(ps[3].second->data.shape(), (core::Shape{3, 0, 2}));  // full view keeps shape
    EXPECT_TRUE(ps[3].second->data.SharesStorage(flat.full()));
    EXPECT_EQ(ps[4].second->data.shape(), core::Shape{});
    ASSERT_TRUE(flat.ShardViews().ok());
    EXPECT_EQ(ps[1].second->data.numel(), 0);
    EXPECT_TRUE(ps[1].second->data.SharesStorage(flat.shard()));
    EXPECT_EQ(ps[3].second->data.shape(), (core::Shape{0}));
    EXPECT_TRUE(ps[2].second->data.SharesStorage(flat.shard()));  // frozen data is sharded too
    ASSERT_TRUE(flat.AllocateShardGrad().ok());
    ASSERT_TRUE(flat.ShardGradViews().ok());
    EXPECT_FALSE(ps[2].second->grad.defined()) << "frozen parameter got a gradient view";
    EXPECT_TRUE(ps[0].second->grad.SharesStorage(flat.shard_grad()));
    EXPECT_TRUE(ps[1].second->grad.SharesStorage(flat.shard_grad()));
    EXPECT_EQ(ps[1].second->grad.numel(), 0);
  }
  // Rank 3's shard is scalar (index 9) followed by two padding zeros.
  EXPECT_EQ(flats[3]->shard().ToVector(), (std::vector<float>{10, 0, 0}));
  EXPECT_EQ(flats[3]->records()[4].shards[3], (ShardSlice{0, 1, 0}));
  EXPECT_EQ(flats[2]->records()[2].shards[2], (ShardSlice{0, 3, 0}));  // frozen at [6, 9)
}

TEST_F(FlatParameterTest, Bf16FullBufferForMixedPrecision) {
  core::Rng rng(105);
  for (int trial = 0; trial < 6; ++trial) {
    const ModelSpec model = RandomModel(rng);
    const int world = 1 + static_cast<int>(rng.UniformInt(8));
    std::vector<std::vector<core::NamedParameter>> copies;
    auto flats = FlattenAllRanks(model, world, &copies);
    for (const auto& flat : flats) {
      ASSERT_TRUE(flat->ShardViews().ok());
      ASSERT_TRUE(flat->FreeFull().ok());
    }
    GatherAll(flats, DType::kBFloat16);
    for (const auto& flat : flats) {
      ASSERT_TRUE(flat->FullViews().ok());
      EXPECT_EQ(flat->shard().dtype(), DType::kFloat32) << "the master shard stays fp32";
      for (size_t i = 0; i < flat->records().size(); ++i) {
        const Tensor& data = flat->params()[i]->data;
        EXPECT_EQ(data.dtype(), DType::kBFloat16);
        EXPECT_EQ(data.shape(), flat->records()[i].shape);
        // No tolerance: each value must be exactly the bf16 rounding of the original.
        std::vector<float> rounded;
        for (float v : model.params[i].values)
          rounded.push_back(core::BFloat16::FromFloat(v).ToFloat());
        EXPECT_EQ(data.ToVector(), rounded);
      }
      // Refused: these would replace fp32 values with rounded ones.
      absl::Status s = flat->Unflatten();
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_TRUE(Contains(s, "bfloat16") && Contains(s, "lose precision")) << s;
      EXPECT_EQ(flat->CopyFullToShard().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_EQ(flat->shard().ToVector(),
                Slice(model.PaddedBuffer(world), flat->rank() * flat->shard_numel(),
                      (flat->rank() + 1) * flat->shard_numel()));
    }
  }
}

TEST_F(FlatParameterTest, CopyShardToFullConvertsIntoTheLocalSlot) {
  std::vector<core::NamedParameter> params = {
      {"a", core::Parameter::Make(Tensor::FromVector({1.0f, 1.00390625f, 3.0f}, {3}).value())}};
  auto flat = FlatParameter::Flatten(params, 1, 0).value();
  ASSERT_TRUE(flat->ShardViews().ok());
  ASSERT_TRUE(flat->FreeFull().ok());
  ASSERT_TRUE(flat->AllocateFull(DType::kBFloat16).ok());
  EXPECT_FALSE(flat->full_filled());
  ASSERT_TRUE(flat->CopyShardToFull().ok());
  EXPECT_TRUE(flat->full_filled()) << "with one rank the local slot is the whole buffer";
  std::vector<float> expected;
  for (float v : {1.0f, 1.00390625f, 3.0f})
    expected.push_back(core::BFloat16::FromFloat(v).ToFloat());
  EXPECT_EQ(flat->LocalChunkOfFull().value().ToVector(), expected);
}

TEST_F(FlatParameterTest, GradientViewsFullAndShard) {
  core::Rng rng(106);
  for (int trial = 0; trial < 8; ++trial) {
    const ModelSpec model = RandomModel(rng);
    for (int world = 1; world <= 8; ++world) {
      std::vector<std::vector<core::NamedParameter>> copies;
      auto flats = FlattenAllRanks(model, world, &copies);
      // Gradient values chosen by the test: element k of parameter i is 100 i + k + 1;
      // frozen parameters have none (zero in the flat gradient).
      std::vector<float> expected_full;
      std::vector<std::vector<float>> grad_values(model.params.size());
      for (size_t i = 0; i < model.params.size(); ++i) {
        for (size_t k = 0; k < model.params[i].values.size(); ++k) {
          grad_values[i].push_back(model.params[i].requires_grad ? 100.0f * i + k + 1 : 0.0f);
        }
        expected_full.insert(expected_full.end(), grad_values[i].begin(), grad_values[i].end());
      }
      while (expected_full.size() % world != 0) expected_full.push_back(0.0f);

      std::vector<float> concatenated;
      for (const auto& flat : flats) {
        ASSERT_TRUE(flat->AllocateFullGrad(DType::kFloat32).ok());
        ASSERT_TRUE(flat->FullGradViews().ok());
        for (size_t i = 0; i < flat->records().size(); ++i) {
          const core::ParameterPtr& p = flat->params()[i];
          if (!p->requires_grad) {
            EXPECT_FALSE(p->grad.defined()) << flat->records()[i].name;
            continue;
          }
          ASSERT_TRUE(p->grad.SharesStorage(flat->full_grad()));
          EXPECT_EQ(p->grad.shape(), flat->records()[i].shape);
          EXPECT_EQ(p->grad.raw_data(),
                    flat->full_grad().data<float>() + flat->records()[i].offset);
          for (int64_t k = 0; k < p->grad.numel(); ++k)
            p->grad.data<float>()[k] = grad_values[i][k];
        }
        EXPECT_EQ(flat->full_grad().ToVector(), expected_full);
        // Freeing a buffer still viewed is refused, naming the parameter.
        const absl::Status busy = flat->FreeFullGrad();
        bool any_trainable = false;
        for (const ParamRecord& rec : flat->records()) any_trainable |= rec.requires_grad;
        if (any_trainable) {
          EXPECT_EQ(busy.code(), absl::StatusCode::kFailedPrecondition);
          EXPECT_TRUE(Contains(busy, "still views it")) << busy;
        } else {
          // All frozen: nothing views the buffer, so it may go (and comes back zeroed).
          EXPECT_TRUE(busy.ok()) << busy;
          EXPECT_FALSE(flat->full_grad().defined());
          ASSERT_TRUE(flat->AllocateFullGrad(DType::kFloat32).ok());
        }

        ASSERT_TRUE(flat->AllocateShardGrad().ok());
        const absl::Status copied = flat->CopyFullGradToShardGrad();
        ASSERT_TRUE(copied.ok()) << copied;
        ASSERT_TRUE(flat->ShardGradViews().ok());
        for (size_t i = 0; i < flat->records().size(); ++i) {
          const core::ParameterPtr& p = flat->params()[i];
          const ShardSlice& s = flat->records()[i].shards[flat->rank()];
          if (!p->requires_grad) {
            EXPECT_FALSE(p->grad.defined());
            continue;
          }
          EXPECT_TRUE(p->grad.SharesStorage(flat->shard_grad()));
          EXPECT_EQ(p->grad.ToVector(), Slice(grad_values[i], s.begin, s.end));
        }
        ASSERT_TRUE(flat->FreeFullGrad().ok());
        EXPECT_EQ(flat->shard_grad().dtype(), DType::kFloat32);
        EXPECT_EQ(flat->shard_grad().storage()->tag(), MemoryTag::kGrad);
        const std::vector<float> shard = flat->shard_grad().ToVector();
        concatenated.insert(concatenated.end(), shard.begin(), shard.end());
        if (any_trainable) {
          EXPECT_EQ(flat->FreeShardGrad().code(), absl::StatusCode::kFailedPrecondition);
        }
        ASSERT_TRUE(flat->ClearGradViews().ok());
        ASSERT_TRUE(flat->FreeShardGrad().ok());
      }
      EXPECT_EQ(concatenated, expected_full);
    }
  }
}

// With one rank the full gradient buffer may be the gradient shard itself: the full
// views write the shard, FreeFullGrad leaves the shard (its grads still view it), and
// FreeShardGrad takes both. Refused with two ranks, without an fp32 shard, or twice.
TEST_F(FlatParameterTest, OneRankFullGradientBufferCanBeTheShard) {
  core::ParameterPtr w = core::Parameter::Make(Tensor::FromVector({1, 2, 3, 4}, {2, 2}).value());
  core::ParameterPtr b = core::Parameter::Make(Tensor::FromVector({5}, {1}).value());
  FlattenOptions options;
  options.label = "fc (Linear)";
  auto two = FlatParameter::Flatten({{"fc.weight", w}}, 2, 0, options).value();
  ASSERT_TRUE(two->AllocateShardGrad().ok());
  absl::Status s = two->UseShardGradAsFullGrad();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "world_size 1") && Contains(s, "fc (Linear)")) << s;

  auto flat = FlatParameter::Flatten({{"fc.weight", w}, {"fc.bias", b}}, 1, 0, options).value();
  s = flat->UseShardGradAsFullGrad();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "AllocateShardGrad first")) << s;
  ASSERT_TRUE(flat->AllocateShardGrad().ok());
  ASSERT_TRUE(flat->UseShardGradAsFullGrad().ok());
  EXPECT_TRUE(flat->full_grad_is_shard_grad());
  EXPECT_EQ(flat->UseShardGradAsFullGrad().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(flat->AllocateFullGrad(DType::kFloat32).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(flat->FullGradViews().ok());
  EXPECT_EQ(w->grad.shape(), (core::Shape{2, 2}));
  w->grad.Fill(0.5f);
  b->grad.Fill(-1.0f);
  EXPECT_EQ(flat->shard_grad().ToVector(), (std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f, -1.0f}));
  ASSERT_TRUE(flat->ShardGradViews().ok());
  ASSERT_TRUE(flat->FreeFullGrad().ok());  // the grads view the shard, which stays
  EXPECT_FALSE(flat->full_grad().defined());
  EXPECT_FALSE(flat->full_grad_is_shard_grad());
  EXPECT_EQ(w->grad.ToVector(), (std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f}));
  // Again, then drop the shard: the alias goes with it.
  ASSERT_TRUE(flat->UseShardGradAsFullGrad().ok());
  ASSERT_TRUE(flat->ClearGradViews().ok());
  ASSERT_TRUE(flat->FreeShardGrad().ok());
  EXPECT_FALSE(flat->full_grad().defined());
  EXPECT_FALSE(flat->full_grad_is_shard_grad());
}

TEST_F(FlatParameterTest, UnflattenCopiesGradsFromFullGradBufferOrDropsThem) {
  for (bool with_grad_buffer : {true, false}) {
    std::vector<core::NamedParameter> params = {
        {"w", core::Parameter::Make(Tensor::FromVector({1, 2, 3, 4}, {2, 2}).value())},
        {"frozen", core::Parameter::Make(Tensor::FromVector({5}, {1}).value(), false)}};
    auto flat = FlatParameter::Flatten(params, 1, 0).value();
    ASSERT_TRUE(flat->AllocateShardGrad().ok());
    ASSERT_TRUE(flat->ShardGradViews().ok());
    if (with_grad_buffer) {
      ASSERT_TRUE(flat->AllocateFullGrad(DType::kFloat32).ok());
      ASSERT_TRUE(flat->FullGradViews().ok());
      params[0].second->grad.Fill(0.5f);
    }
    Tensor full_grad = flat->full_grad();
    ASSERT_TRUE(flat->Unflatten().ok());
    const core::ParameterPtr& w = params[0].second;
    EXPECT_EQ(w->data.ToVector(), (std::vector<float>{1, 2, 3, 4}));
    EXPECT_EQ(w->data.shape(), (core::Shape{2, 2}));
    EXPECT_FALSE(params[1].second->grad.defined());
    if (with_grad_buffer) {
      ASSERT_TRUE(w->grad.defined());
      EXPECT_EQ(w->grad.shape(), (core::Shape{2, 2}));
      EXPECT_EQ(w->grad.ToVector(), (std::vector<float>(4, 0.5f)));
      EXPECT_FALSE(w->grad.SharesStorage(full_grad));
      EXPECT_EQ(w->grad.storage()->tag(), MemoryTag::kGrad);
    } else {
      EXPECT_FALSE(w->grad.defined()) << "without a full gradient buffer grads are dropped";
    }
    full_grad = Tensor();
    // Only the parameters' own storage remains: 5 elements, plus 4 for w's gradient.
    EXPECT_EQ(alloc_->Stats().current_total, (with_grad_buffer ? 9 : 5) * 4);
  }
}

TEST_F(FlatParameterTest, FlattenDropsExistingGradients) {
  core::ParameterPtr p = core::Parameter::Make(Tensor::FromVector({1, 2}, {2}).value());
  ASSERT_TRUE(p->EnsureGrad().ok());
  auto flat = FlatParameter::Flatten({{"p", p}}, 2, 1).value();
  EXPECT_FALSE(p->grad.defined());
  EXPECT_EQ(alloc_->Stats().current(MemoryTag::kGrad), 0);
}

TEST_F(FlatParameterTest, EmptyParameterList) {
  auto flat = FlatParameter::Flatten({}, 3, 2).value();
  EXPECT_EQ(flat->padded_numel(), 0);
  EXPECT_EQ(flat->shard().numel(), 0);
  EXPECT_TRUE(flat->ShardViews().ok());
  EXPECT_TRUE(flat->Unflatten().ok());
}

TEST_F(FlatParameterTest, InvalidInputsAreRejectedAndChangeNothing) {
  core::ParameterPtr a = core::Parameter::Make(Tensor::FromVector({1, 2}, {2}).value());
  core::ParameterPtr b = core::Parameter::Make(Tensor::FromVector({3}, {1}).value());
  const Tensor a_before = a->data;
  FlattenOptions options;
  options.label = "blocks.0 (TransformerBlock)";
  auto expect_invalid = [&](const std::vector<core::NamedParameter>& params, int world, int rank,
                            const std::string& text) {
    absl::StatusOr<std::unique_ptr<FlatParameter>> flat =
        FlatParameter::Flatten(params, world, rank, options);
    ASSERT_FALSE(flat.ok());
    EXPECT_EQ(flat.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(flat.status(), text)) << flat.status();
    EXPECT_TRUE(Contains(flat.status(), options.label)) << flat.status();
    EXPECT_TRUE(a->data.SharesStorage(a_before)) << "a failed Flatten changed a parameter";
  };
  expect_invalid({{"a", a}}, 0, 0, "world_size");
  expect_invalid({{"a", a}}, 2, 2, "rank");
  expect_invalid({{"a", a}}, 2, -1, "rank");
  expect_invalid({{"a", a}, {"b", nullptr}}, 1, 0, "'b' is null");
  expect_invalid({{"a", a}, {"b", core::Parameter::Make(Tensor())}}, 1, 0, "'b' has undefined");
  expect_invalid({{"a", a}, {"ids", core::Parameter::Make(Tensor::FromInts({1}, {1}).value())}}, 1,
                 0, "'ids' is int32");
  expect_invalid({{"a", a}, {"h", core::Parameter::Make(Tensor::Zeros({2}, DType::kBFloat16))}}, 1,
                 0, "'h' is bfloat16 but 'a' is float32");
  expect_invalid({{"a", a}, {"a", b}}, 1, 0, "two different parameters are named 'a'");
  // Mixed devices cannot be built in a CPU-only test (a CUDA tensor needs a GPU); the
  // check sits beside the dtype one in Flatten.
}

TEST_F(FlatParameterTest, BufferStateErrorsNameTheProblem) {
  core::ParameterPtr w = core::Parameter::Make(Tensor::FromVector({1, 2, 3}, {3}).value());
  FlattenOptions options;
  options.label = "mlp (Linear)";
  auto flat = FlatParameter::Flatten({{"mlp.weight", w}}, 2, 0, options).value();

  absl::Status s = flat->FreeFull();  // w views the full buffer
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "'mlp.weight' still views it") && Contains(s, "mlp (Linear)")) << s;
  EXPECT_EQ(flat->AllocateFull(DType::kFloat32).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(flat->ShardViews().ok());
  ASSERT_TRUE(flat->FreeFull().ok());
  ASSERT_TRUE(flat->FreeFull().ok()) << "freeing twice is a no-op";

  s = flat->FullViews();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "not allocated")) << s;
  EXPECT_EQ(flat->MarkFullFilled().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(flat->LocalChunkOfFull().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(flat->CopyFullToShard().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(flat->CopyShardToFull().code(), absl::StatusCode::kFailedPrecondition);
  s = flat->Unflatten();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "not allocated") && Contains(s, "MarkFullFilled")) << s;
  EXPECT_EQ(flat->AllocateFull(DType::kInt32).code(), absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(flat->AllocateFull(DType::kFloat32).ok());
  ASSERT_TRUE(flat->CopyShardToFull().ok());  // only rank 0's slot: not filled with 2 ranks
  EXPECT_FALSE(flat->full_filled());
  s = flat->Unflatten();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "not marked filled")) << s;
  EXPECT_TRUE(w->data.SharesStorage(flat->shard())) << "a failed Unflatten changed the data";

  EXPECT_EQ(flat->FullGradViews().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(flat->ShardGradViews().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(flat->LocalChunkOfFullGrad().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(flat->CopyFullGradToShardGrad().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(flat->AllocateFullGrad(DType::kInt32).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(flat->AllocateShardGrad().ok());
  EXPECT_EQ(flat->AllocateShardGrad().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(flat->CopyFullGradToShardGrad().code(), absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE(flat->MarkFullFilled().ok());
  ASSERT_TRUE(flat->Unflatten().ok());
  for (const absl::Status& after :
       {flat->ShardViews(), flat->FullViews(), flat->AllocateFull(DType::kFloat32),
        flat->Unflatten(), flat->ClearGradViews()}) {
    EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Contains(after, "after Unflatten")) << after;
  }
  EXPECT_EQ(flat->records().size(), 1u) << "records stay readable";
}

}  // namespace
}  // namespace flatten
