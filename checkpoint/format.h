// Constants of the on-disk checkpoint format (checkpoint/checkpoint.proto, NOTE
// [Checksum coverage]) that both the public API (sharded.h) and the metadata codec
// (internal/metadata.h) use.
//
//   if (info.format_version != checkpoint::kFormatVersion) ...
//   std::string path = dir + "/" + checkpoint::kMetadataFileName;
#ifndef CHECKPOINT_FORMAT_H_
#define CHECKPOINT_FORMAT_H_

#include <cstdint>

namespace checkpoint {

// Version written into metadata.pb; readers refuse every other one. 2: metadata.pb has a
// checksummed header and data files are wholly covered by chunks (NOTE [Checksum
// coverage]); 1 had neither.
inline constexpr int kFormatVersion = 2;
// Name of the metadata file inside a checkpoint directory.
inline constexpr char kMetadataFileName[] = "metadata.pb";
// Default checksum block (SaveOptions::block_bytes).
inline constexpr int64_t kDefaultBlockBytes = int64_t{1} << 20;
// Largest checksum block Save writes and readers accept (1 GiB).
inline constexpr int64_t kMaxBlockBytes = int64_t{1} << 30;

}  // namespace checkpoint

#endif  // CHECKPOINT_FORMAT_H_
