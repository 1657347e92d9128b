// Fuzz target: untrusted bytes -> the metadata.pb codec and validator
// (internal::ParseMetadataFile), and, so the fuzzer reaches the validator past the
// checksums, the same bytes parsed as a bare CheckpointMetadata -> IndexMetadata and
// re-encoded with valid checksums -> ParseMetadataFile. Neither may crash, abort or
// overflow; whatever is accepted must be self-consistent.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/internal/metadata.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using checkpoint::CheckpointMetadata;
  namespace internal = checkpoint::internal;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  // The file as it would be read from disk.
  (void)internal::ParseMetadataFile(bytes, "/fuzz", "/fuzz/metadata.pb");
  // The body alone, checksums bypassed.
  CheckpointMetadata meta;
  if (!meta.ParseFromString(bytes)) return 0;
  absl::StatusOr<internal::MetadataIndex> direct =
      internal::IndexMetadata(meta, "/fuzz", "/fuzz/metadata.pb");
  absl::StatusOr<internal::MetadataIndex> framed =
      internal::ParseMetadataFile(internal::EncodeMetadataFile(meta), "/fuzz", "/fuzz/metadata.pb");
  // Framing with correct checksums changes nothing about validity.
  if (direct.ok() != framed.ok()) std::abort();
  if (direct.ok()) {
    // An accepted index is consistent: one dtype, shape and numel per tensor.
    const int n = direct->proto.tensors_size();
    if (static_cast<int>(direct->dtypes.size()) != n ||
        static_cast<int>(direct->shapes.size()) != n ||
        static_cast<int>(direct->numels.size()) != n ||
        static_cast<int>(direct->by_name.size()) != n) {
      std::abort();
    }
  }
  return 0;
}
