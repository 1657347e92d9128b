// checkpoint::ReadMetadata, Load, LoadFull and VerifyCheckpoint (sharded.h): each
// request reads, with pread, only the checksum blocks that overlap it, verifies them,
// and converts the elements into the destination. A data file's size is checked
// against the metadata when it is opened, before any of it is used.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/internal/file_io.h"
#include "checkpoint/internal/host_staging.h"
#include "checkpoint/internal/metadata.h"
#include "checkpoint/sharded.h"
#include "core/status_macros.h"

namespace checkpoint {

const TensorInfo* CheckpointInfo::Find(const std::string& name) const {
  for (const TensorInfo& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<CheckpointInfo> ReadMetadata(const std::string& dir_in) {
  ASSIGN_OR_RETURN(const std::string dir,
                   internal::NormalizeDirectory(dir_in, "checkpoint::ReadMetadata"));
  ASSIGN_OR_RETURN(internal::MetadataIndex index, internal::ReadMetadataIndex(dir));
  CheckpointInfo info;
  info.format_version = index.proto.format_version();
  info.world_size = index.proto.world_size();
  info.step = index.proto.step();
  for (const auto& [k, v] : index.proto.user_metadata()) info.user_metadata[k] = v;
  for (const auto& [k, v] : index.proto.records()) info.records[k] = v;
  for (int i = 0; i < index.proto.tensors_size(); ++i) {
    info.tensors.push_back({index.proto.tensors(i).name(), index.shapes[i], index.dtypes[i]});
  }
  return info;
}

namespace {

// Serves requests against one validated metadata index, keeping each data file open
// for the duration of one Load.
class Loader {
 public:
  explicit Loader(const internal::MetadataIndex& index) : index_(index) {}

  absl::Status Serve(const LoadRequest& request);
  // Opens (and checks the size of) every data file tensor `i` has chunks in.
  absl::Status OpenFilesOf(int i);
  // For a message about data file `file` cut at `size` bytes: " (it ends inside tensor
  // ...)" naming the chunk holding byte `size`, or "".
  std::string CutAt(const std::string& file, int64_t size) const;
  // Opens data file `name` (checking its size) if it is not open yet.
  absl::Status CheckFile(const std::string& name) { return File(name, "").status(); }
  // Reads and verifies every block of tensor `i`, using nothing.
  absl::Status VerifyTensor(int i);
  const LoadStats& stats() const { return stats_; }

 private:
  absl::StatusOr<const internal::FileReader*> File(const std::string& name,
                                                   const std::string& tensor);
  // Copies elements [begin, end) of chunk `c` of tensor `t` (stored as `dtype`) into
  // `out` (dtype `out_dtype`).
  absl::Status ReadChunkPart(const TensorProto& t, core::DType dtype, const ChunkProto& c,
                             int64_t begin, int64_t end, char* out, core::DType out_dtype);

  const internal::MetadataIndex& index_;
  std::map<std::string, std::unique_ptr<internal::FileReader>> files_;
  std::vector<char> buffer_;
  std::vector<char> scratch_;
  LoadStats stats_;
};

absl::StatusOr<const internal::FileReader*> Loader::File(const std::string& name,
                                                         const std::string& tensor) {
  auto it = files_.find(name);
  if (it != files_.end()) return it->second.get();
  const std::string path = internal::JoinPath(index_.dir, name);
  const std::string of = tensor.empty() ? "" : absl::StrCat(" of tensor '", tensor, "'");
  absl::StatusOr<internal::FileReader> reader = internal::FileReader::Open(path);
  if (!reader.ok()) {
    return absl::DataLossError(absl::StrCat("data file '", path, "'", of,
                                            " cannot be opened: ", reader.status().message()));
  }
  ++stats_.files_opened;
  // NOTE [Checksum coverage]: the file must be exactly the size the metadata records.
  absl::StatusOr<int64_t> size = reader->Size();
  if (!size.ok()) {
    return absl::DataLossError(
        absl::StrCat("data file '", path, "'", of, ": ", size.status().message()));
  }
  const int64_t recorded = index_.file_sizes.at(name);
  if (*size != recorded) {
    return absl::DataLossError(
        absl::StrCat("data file '", path, "'", of, " is ",
                     *size < recorded ? "truncated" : "longer than recorded", ": it has ", *size,
                     " bytes, the checkpoint metadata records ", recorded, CutAt(name, *size)));
  }
  auto owned = std::make_unique<internal::FileReader>(*std::move(reader));
  const internal::FileReader* raw = owned.get();
  files_.emplace(name, std::move(owned));
  return raw;
}

absl::Status Loader::ReadChunkPart(const TensorProto& t, core::DType dtype, const ChunkProto& c,
                                   int64_t begin, int64_t end, char* out, core::DType out_dtype) {
  const int64_t es = core::DTypeSize(dtype);
  const int64_t block = index_.proto.block_bytes();
  // Bytes wanted, relative to the chunk, widened to whole checksum blocks.
  const int64_t want_begin = (begin - c.begin()) * es;
  const int64_t want_end = (end - c.begin()) * es;
  const int64_t first_block = want_begin / block;
  const int64_t read_begin = first_block * block;
  const int64_t read_end = std::min(c.byte_length(), (want_end + block - 1) / block * block);
  const int64_t n = read_end - read_begin;
  ASSIGN_OR_RETURN(const internal::FileReader* file, File(c.file(), t.name()));
  buffer_.resize(static_cast<size_t>(n));
  const int64_t file_begin = c.byte_offset() + read_begin;
  ASSIGN_OR_RETURN(size_t got, file->ReadAt(file_begin, static_cast<size_t>(n), buffer_.data()));
  stats_.bytes_read += static_cast<int64_t>(got);
  if (static_cast<int64_t>(got) < n) {
    absl::StatusOr<int64_t> size = file->Size();
    return absl::DataLossError(absl::StrCat(
        "data file '", file->path(), "' is truncated: tensor '", t.name(), "' needs bytes [",
        file_begin, ", ", file_begin + n, ") but the file has ",
        size.ok() ? absl::StrCat(*size) : std::string("an unknown number of"), " bytes"));
  }
  for (int64_t off = 0, k = first_block; off < n; off += block, ++k) {
    const int64_t len = std::min(block, n - off);
    const uint32_t crc = Crc32c(buffer_.data() + off, static_cast<size_t>(len));
    ++stats_.blocks_verified;
    if (crc != c.block_crc32c(static_cast<int>(k))) {
      return absl::DataLossError(
          absl::StrCat("checksum mismatch in data file '", file->path(), "': tensor '", t.name(),
                       "', bytes [", file_begin + off, ", ", file_begin + off + len, ") (block ", k,
                       " of its elements [", c.begin(), ", ", c.end(), "))"));
    }
  }
  internal::ConvertElements(buffer_.data() + (want_begin - read_begin), dtype, out, out_dtype,
                            end - begin);
  return absl::OkStatus();
}

std::string Loader::CutAt(const std::string& file, int64_t size) const {
  for (const TensorProto& t : index_.proto.tensors()) {
    for (const ChunkProto& c : t.chunks()) {
      if (c.file() == file && c.byte_offset() <= size && size < c.byte_offset() + c.byte_length()) {
        return absl::StrCat(" (it ends inside tensor '", t.name(), "', elements [", c.begin(), ", ",
                            c.end(), ") at bytes [", c.byte_offset(), ", ",
                            c.byte_offset() + c.byte_length(), "))");
      }
    }
  }
  return "";
}

absl::Status Loader::OpenFilesOf(int i) {
  const TensorProto& t = index_.proto.tensors(i);
  for (const ChunkProto& c : t.chunks()) RETURN_IF_ERROR(File(c.file(), t.name()).status());
  return absl::OkStatus();
}

absl::Status Loader::VerifyTensor(int i) {
  const TensorProto& t = index_.proto.tensors(i);
  const core::DType dtype = index_.dtypes[i];
  for (const ChunkProto& c : t.chunks()) {
    // Block by block, so memory stays at one block.
    const int64_t es = core::DTypeSize(dtype);
    const int64_t per_block = std::max<int64_t>(1, index_.proto.block_bytes() / es);
    for (int64_t b = c.begin(); b < c.end(); b += per_block) {
      const int64_t e = std::min(c.end(), b + per_block);
      scratch_.resize(static_cast<size_t>((e - b) * es));
      RETURN_IF_ERROR(ReadChunkPart(t, dtype, c, b, e, scratch_.data(), dtype));
    }
  }
  return absl::OkStatus();
}

absl::Status Loader::Serve(const LoadRequest& r) {
  const int i = index_.Find(r.name);
  if (i < 0) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint '", index_.dir, "' has no tensor '", r.name, "'"));
  }
  const TensorProto& t = index_.proto.tensors(i);
  const core::DType dtype = index_.dtypes[i];
  const int64_t numel = index_.numels[i];
  const std::string what =
      absl::StrCat("checkpoint::Load from '", index_.dir, "': tensor '", r.name, "' of shape ",
                   core::ShapeToString(index_.shapes[i]), " (", numel, " elements)");
  if (r.begin < 0 || r.end < r.begin || r.end > numel) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": range [", r.begin, ", ", r.end, ") is out of bounds"));
  }
  const int64_t n = r.end - r.begin;
  if (n == 0 && !r.destination.defined()) return absl::OkStatus();
  if (!r.destination.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": range [", r.begin, ", ", r.end, ") has an undefined destination"));
  }
  if (r.destination.numel() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": range [", r.begin, ", ", r.end, ") has ", n, " elements but the destination ",
        r.destination.ToString(), " has ", r.destination.numel()));
  }
  const core::DType out_dtype = r.destination.dtype();
  if (!internal::Convertible(dtype, out_dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": stored as ", core::DTypeName(dtype),
                                                   ", cannot load into ",
                                                   core::DTypeName(out_dtype)));
  }
  if (n == 0) return absl::OkStatus();
  // CPU destinations are filled in place; others through a CPU staging tensor.
  core::Tensor target = r.destination;
  if (!target.device().is_cpu()) {
    ASSIGN_OR_RETURN(target, core::Tensor::Allocate({n}, out_dtype, core::MemoryTag::kOther));
  }
  char* out = static_cast<char*>(target.raw_data());
  const int64_t out_es = core::DTypeSize(out_dtype);
  // Chunks tile [0, numel) in order (checked by ReadMetadataIndex): find the first one
  // that ends after r.begin.
  const auto& chunks = t.chunks();
  auto it = std::upper_bound(chunks.begin(), chunks.end(), r.begin,
                             [](int64_t v, const ChunkProto& c) { return v < c.end(); });
  for (; it != chunks.end() && it->begin() < r.end; ++it) {
    const int64_t b = std::max(r.begin, it->begin());
    const int64_t e = std::min(r.end, it->end());
    if (b >= e) continue;
    RETURN_IF_ERROR(ReadChunkPart(t, dtype, *it, b, e, out + (b - r.begin) * out_es, out_dtype));
  }
  if (!r.destination.device().is_cpu()) {
    // Through a pinned buffer (internal/host_staging.h).
    RETURN_IF_ERROR(internal::CopyHostToTensor(r.destination, target, what));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LoadStats> Load(const std::string& dir_in,
                               const std::vector<LoadRequest>& requests) {
  ASSIGN_OR_RETURN(const std::string dir, internal::NormalizeDirectory(dir_in, "checkpoint::Load"));
  ASSIGN_OR_RETURN(internal::MetadataIndex index, internal::ReadMetadataIndex(dir));
  Loader loader(index);
  for (const LoadRequest& r : requests) RETURN_IF_ERROR(loader.Serve(r));
  return loader.stats();
}

absl::StatusOr<std::vector<std::pair<std::string, core::Tensor>>> LoadFull(
    const std::string& dir_in, const std::vector<std::string>& names, core::MemoryTag tag) {
  ASSIGN_OR_RETURN(const std::string dir,
                   internal::NormalizeDirectory(dir_in, "checkpoint::LoadFull"));
  ASSIGN_OR_RETURN(internal::MetadataIndex index, internal::ReadMetadataIndex(dir));
  std::vector<int> which;
  if (names.empty()) {
    for (int i = 0; i < index.proto.tensors_size(); ++i) which.push_back(i);
  } else {
    for (const std::string& name : names) {
      const int i = index.Find(name);
      if (i < 0) {
        return absl::NotFoundError(
            absl::StrCat("checkpoint '", dir, "' has no tensor '", name, "'"));
      }
      which.push_back(i);
    }
  }
  std::vector<std::pair<std::string, core::Tensor>> out;
  Loader loader(index);
  for (int i : which) {
    // Damaged files are refused before memory is allocated for what they claim to hold.
    RETURN_IF_ERROR(loader.OpenFilesOf(i));
    ASSIGN_OR_RETURN(core::Tensor t, core::Tensor::Allocate(index.shapes[i], index.dtypes[i], tag));
    LoadRequest r{index.proto.tensors(i).name(), 0, index.numels[i], t};
    RETURN_IF_ERROR(loader.Serve(r));
    out.emplace_back(r.name, std::move(t));
  }
  return out;
}

absl::StatusOr<LoadStats> VerifyCheckpoint(const std::string& dir_in) {
  ASSIGN_OR_RETURN(const std::string dir,
                   internal::NormalizeDirectory(dir_in, "checkpoint::VerifyCheckpoint"));
  ASSIGN_OR_RETURN(internal::MetadataIndex index, internal::ReadMetadataIndex(dir));
  Loader loader(index);
  for (const DataFileProto& f : index.proto.files()) RETURN_IF_ERROR(loader.CheckFile(f.name()));
  for (int i = 0; i < index.proto.tensors_size(); ++i) RETURN_IF_ERROR(loader.VerifyTensor(i));
  return loader.stats();
}

}  // namespace checkpoint
