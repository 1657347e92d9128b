// The metadata.pb codec and validator shared by checkpoint::Save and checkpoint::Load,
// plus small helpers both use: data file names, checked element counts and element
// conversion. Internal to checkpoint/ (and to the tests and fuzz targets that forge
// metadata); everything else goes through checkpoint/sharded.h.
//
//   ASSIGN_OR_RETURN(auto index, checkpoint::internal::ReadMetadataIndex(dir));
//   const int i = index.Find("fc.weight");              // -1 when absent
//   // Forging a checkpoint in a test: decode, edit, re-encode with valid checksums.
//   ASSIGN_OR_RETURN(CheckpointMetadata meta, DecodeMetadataFile(bytes, path));
//   std::string again = EncodeMetadataFile(meta);
//
// See NOTE [Checksum coverage] in checkpoint/checkpoint.proto for the file layout.
#ifndef CHECKPOINT_INTERNAL_METADATA_H_
#define CHECKPOINT_INTERNAL_METADATA_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/checkpoint.pb.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace checkpoint {
namespace internal {

// The first 8 bytes of every metadata.pb since format version 2.
inline constexpr char kMetadataMagic[] = "FSDPCKPT";
inline constexpr size_t kMetadataMagicBytes = 8;
// Magic, version, body length, body CRC32C, header CRC32C.
inline constexpr size_t kMetadataHeaderBytes = 28;

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
  std::vector<core::DType> dtypes;  // per proto.tensors() entry
  std::vector<core::Shape> shapes;
  std::vector<int64_t> numels;
  // Data file name -> its recorded size in bytes (DataFileProto.size_bytes).
  std::map<std::string, int64_t> file_sizes;

  // Index of the tensor named `name` in proto.tensors(), or -1.
  int Find(const std::string& name) const;
};

// metadata.pb's bytes for `meta`: the checksummed header, then meta serialized
// (NOTE [Checksum coverage]). Writes the header's version from meta.format_version().
std::string EncodeMetadataFile(const CheckpointMetadata& meta);

// Checks the header and checksums of a metadata.pb's `bytes` and parses its body;
// `path` is named in every error. DataLoss for a file shorter than the header, a wrong
// magic, a header or body checksum mismatch, a body length that disagrees with the file
// (truncated or extended), a body that does not parse or whose format_version differs
// from the header's; FailedPrecondition naming the version for a version-1 file (which
// has no checksum) or an intact header of another version. Does not validate the
// message's contents (IndexMetadata does).
absl::StatusOr<CheckpointMetadata> DecodeMetadataFile(absl::string_view bytes,
                                                      const std::string& path);

// Validates a metadata message and indexes it; `path` is named in errors, `dir` kept in
// the index. FailedPrecondition for another format_version; otherwise DataLoss naming the
// field (and tensor, chunk or data file) for anything inconsistent: a world_size below 1,
// a block_bytes outside (0, kMaxBlockBytes], data files that are not exactly
// DataFileName(r, world_size) for r = 0, 1, ... with non-negative sizes, tensors with no
// or duplicate names, unknown dtypes, shapes with negative dimensions or more than 2^50
// elements, chunks that do not tile [0, numel) in order with non-empty ranges, byte
// lengths that are not the range's size, byte ranges outside their file, a wrong number
// of block checksums, and data files whose bytes are not exactly tiled by their chunks.
// All arithmetic on these untrusted sizes is overflow-checked.
absl::StatusOr<MetadataIndex> IndexMetadata(CheckpointMetadata proto, const std::string& dir,
                                            const std::string& path);

// DecodeMetadataFile, then IndexMetadata.
absl::StatusOr<MetadataIndex> ParseMetadataFile(absl::string_view bytes, const std::string& dir,
                                                const std::string& path);

// Reads `<dir>/metadata.pb` and parses it (see checkpoint::ReadMetadata for the errors).
absl::StatusOr<MetadataIndex> ReadMetadataIndex(const std::string& dir);

}  // namespace internal
}  // namespace checkpoint

#endif  // CHECKPOINT_INTERNAL_METADATA_H_
