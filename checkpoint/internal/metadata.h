// Helpers shared by checkpoint::Save and checkpoint::Load: data file names, checked
// element counts, element conversion, and the validation of a parsed metadata.pb.
//
//   ASSIGN_OR_RETURN(auto index, checkpoint::internal::ReadMetadataIndex(dir));
//   const checkpoint::TensorProto* t = index.Find("fc.weight");
#ifndef CHECKPOINT_INTERNAL_METADATA_H_
#define CHECKPOINT_INTERNAL_METADATA_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/checkpoint.pb.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace checkpoint {
namespace internal {

// "rank-00001-of-00004.bin".
std::string DataFileName(int rank, int world_size);

// "<dir>/<name>".
std::string JoinPath(const std::string& dir, const std::string& name);

// `dir` without trailing slashes ("/" stays "/"); InvalidArgument for "".
absl::StatusOr<std::string> NormalizeDirectory(const std::string& dir, const char* caller);

// Number of elements of `shape`, or InvalidArgument (naming `what`) for a negative
// dimension or a count above 2^50 (core::Tensor's bound).
absl::StatusOr<int64_t> CheckedNumel(const core::Shape& shape, const std::string& what);

// True when elements of `from` can be converted to `to` (equal, or fp32 <-> bf16).
bool Convertible(core::DType from, core::DType to);

// Converts `n` elements at `src` (dtype `from`) into `dst` (dtype `to`); requires
// Convertible(from, to). Unaligned pointers are fine.
void ConvertElements(const void* src, core::DType from, void* dst, core::DType to, int64_t n);

// A validated metadata.pb with a name index and parsed dtypes and shapes.
struct MetadataIndex {
  std::string dir;
  CheckpointMetadata proto;
  std::map<std::string, int> by_name;
  std::vector<core::DType> dtypes;   // per proto.tensors() entry
  std::vector<core::Shape> shapes;
  std::vector<int64_t> numels;

  // Index of the tensor named `name` in proto.tensors(), or -1.
  int Find(const std::string& name) const;
};

// Reads `<dir>/metadata.pb` and checks it (see checkpoint::ReadMetadata for the errors).
absl::StatusOr<MetadataIndex> ReadMetadataIndex(const std::string& dir);

// The same checks for an in-memory metadata message; `path` is named in errors.
absl::StatusOr<MetadataIndex> IndexMetadata(CheckpointMetadata proto, const std::string& dir,
                                            const std::string& path);

}  // namespace internal
}  // namespace checkpoint

#endif  // CHECKPOINT_INTERNAL_METADATA_H_
