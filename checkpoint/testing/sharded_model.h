// Test helpers for checkpoint/: a model's worth of tensors sharded the way FSDP shards
// them (each unit's tensors concatenated, padded to a multiple of the world size and
// chunked by flatten's shard math; a few tensors replicated on every rank), saved and
// loaded over thread ranks, and raw access to a checkpoint's metadata.pb.
//
//   const checkpoint::testing::Model m = checkpoint::testing::MakeModel(/*version=*/1);
//   ASSERT_TRUE(checkpoint::testing::SaveAt(2, dir, m).ok());
//   EXPECT_TRUE(checkpoint::testing::LoadAndCheckAt(3, dir, m).ok());   // bit for bit
#ifndef CHECKPOINT_TESTING_SHARDED_MODEL_H_
#define CHECKPOINT_TESTING_SHARDED_MODEL_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/sharded.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "flatten/shard_math.h"

namespace checkpoint {
namespace testing {

struct Spec {
  std::string name;
  core::Shape shape;
  core::DType dtype;
};

struct Model {
  // Units of flat-sharded tensors (one dtype per unit, as in a FlatParameter).
  std::vector<std::vector<Spec>> units;
  std::vector<Spec> replicated;
  // The full value of every tensor.
  std::map<std::string, core::Tensor> full;
};

// Deterministic contents for `spec`, derived from its name and `version`.
core::Tensor MakeFull(const Spec& spec, int version);

// Two units (fp32 tensors including an empty one and a scalar; one bf16) and two
// replicated tensors (an int32 step and an fp32 vector), with contents of `version`.
Model MakeModel(int version = 0);

// The [begin, end) ranges rank `rank` of `world` holds, per tensor name.
std::map<std::string, flatten::ShardSlice> RankRanges(const Model& m, int world, int rank);

// This rank's slices, each holding its own copy of its elements (as a sharded model
// would).
std::vector<TensorSlice> RankSlices(const Model& m, int world, int rank);

// True when `a` and `b` have the same dtype, numel and bytes.
bool SameBytes(const core::Tensor& a, const core::Tensor& b);

// A fresh, empty directory "<TEST_TMPDIR>/sharded_<name>".
std::string TestRoot(const std::string& name);

// The names of the entries of `dir`, sorted.
std::vector<std::string> Entries(const std::string& dir);

// Saves `m` to `dir` from `world` thread ranks, each passing RankSlices.
absl::Status SaveAt(int world, const std::string& dir, const Model& m,
                    const SaveOptions& options = SaveOptions());

// Every rank of `world` loads its own ranges of every tensor and checks them bit for
// bit; Internal naming the rank and tensor otherwise.
absl::Status LoadAndCheckAt(int world, const std::string& dir, const Model& m);

// A file's bytes, and replacing them.
std::string ReadBytes(const std::string& path);
void WriteBytes(const std::string& path, const std::string& bytes);

// `dir`'s metadata.pb decoded (a test failure and an empty message if it does not
// decode), and writing one with valid checksums (a forged checkpoint).
CheckpointMetadata ReadProto(const std::string& dir);
void WriteProto(const std::string& dir, const CheckpointMetadata& meta);

}  // namespace testing
}  // namespace checkpoint

#endif  // CHECKPOINT_TESTING_SHARDED_MODEL_H_
