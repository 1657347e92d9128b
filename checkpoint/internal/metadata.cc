#include "checkpoint/internal/metadata.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/format.h"
#include "checkpoint/internal/file_io.h"
#include "core/status_macros.h"

namespace checkpoint {
namespace internal {

std::string DataFileName(int rank, int world_size) {
  return absl::StrFormat("rank-%05d-of-%05d.bin", rank, world_size);
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (!dir.empty() && dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

absl::StatusOr<std::string> NormalizeDirectory(const std::string& dir, const char* caller) {
  if (dir.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(caller, ": the checkpoint directory is empty"));
  }
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return d;
}

absl::StatusOr<int64_t> CheckedNumel(const core::Shape& shape, const std::string& what) {
  constexpr int64_t kMax = int64_t{1} << 50;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " has a negative dimension in shape ", core::ShapeToString(shape)));
    }
    if (d != 0 && n > kMax / d) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " has shape ", core::ShapeToString(shape), ", more than 2^50 elements"));
    }
    n *= d;
  }
  return n;
}

bool Convertible(core::DType from, core::DType to) {
  if (from == to) return true;
  return from != core::DType::kInt32 && to != core::DType::kInt32;
}

void ConvertElements(const void* src, core::DType from, void* dst, core::DType to, int64_t n) {
  if (n <= 0) return;
  if (from == to) {
    std::memcpy(dst, src, static_cast<size_t>(n * core::DTypeSize(from)));
    return;
  }
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  if (from == core::DType::kFloat32 && to == core::DType::kBFloat16) {
    for (int64_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, s + 4 * i, 4);
      const core::BFloat16 h = core::BFloat16::FromFloat(f);
      std::memcpy(d + 2 * i, &h.bits, 2);
    }
  } else if (from == core::DType::kBFloat16 && to == core::DType::kFloat32) {
    for (int64_t i = 0; i < n; ++i) {
      core::BFloat16 h;
      std::memcpy(&h.bits, s + 2 * i, 2);
      const float f = h.ToFloat();
      std::memcpy(d + 4 * i, &f, 4);
    }
  }
}

int MetadataIndex::Find(const std::string& name) const {
  auto it = by_name.find(name);
  return it == by_name.end() ? -1 : it->second;
}

namespace {

void PutLe(uint64_t v, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetLe(absl::string_view bytes, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  return v;
}

// True for the metadata.pb of format version 1: a bare CheckpointMetadata, which
// serializes format_version (field 1, varint 1) first.
bool IsVersionOneFile(absl::string_view bytes) {
  if (bytes.size() < 2 || bytes[0] != '\x08' || bytes[1] != '\x01') return false;
  CheckpointMetadata legacy;
  return legacy.ParseFromArray(bytes.data(),
                               static_cast<int>(std::min<size_t>(bytes.size(), INT32_MAX))) &&
         legacy.format_version() == 1;
}

// One chunk's byte range in its file, for the whole-file coverage check.
struct Extent {
  int64_t offset;
  int64_t length;
  int tensor;
  int chunk;
};

}  // namespace

std::string EncodeMetadataFile(const CheckpointMetadata& meta) {
  const std::string body = meta.SerializeAsString();
  std::string out(kMetadataMagic, kMetadataMagicBytes);
  PutLe(static_cast<uint32_t>(meta.format_version()), 4, &out);
  PutLe(body.size(), 8, &out);
  PutLe(Crc32c(body.data(), body.size()), 4, &out);
  PutLe(Crc32c(out.data(), out.size()), 4, &out);
  out += body;
  return out;
}

absl::StatusOr<CheckpointMetadata> DecodeMetadataFile(absl::string_view bytes,
                                                      const std::string& path) {
  auto loss = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("checkpoint metadata '", path, "': ", what));
  };
  if (bytes.size() < kMetadataMagicBytes ||
      std::memcmp(bytes.data(), kMetadataMagic, kMetadataMagicBytes) != 0) {
    if (IsVersionOneFile(bytes)) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint metadata '", path,
                       "' has format version 1, which has no checksums; this "
                       "build reads only version ",
                       kFormatVersion,
                       " and does not convert old checkpoints "
                       "(none are meant to be kept): save the checkpoint again with this build"));
    }
    return loss(absl::StrCat(bytes.size(), " bytes that do not start with the magic \"",
                             kMetadataMagic, "\" (damaged, or not a checkpoint's metadata)"));
  }
  if (bytes.size() < kMetadataHeaderBytes) {
    return loss(absl::StrCat("truncated: ", bytes.size(), " bytes, shorter than the ",
                             kMetadataHeaderBytes, "-byte header"));
  }
  const uint32_t header_crc = static_cast<uint32_t>(GetLe(bytes, 24, 4));
  if (Crc32c(bytes.data(), 24) != header_crc) {
    return loss("header checksum mismatch (the header is damaged)");
  }
  const uint32_t version = static_cast<uint32_t>(GetLe(bytes, 8, 4));
  if (version != static_cast<uint32_t>(kFormatVersion)) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint metadata '", path,
                                                      "' has format version ", version,
                                                      "; this build reads only "
                                                      "version ",
                                                      kFormatVersion));
  }
  const uint64_t length = GetLe(bytes, 12, 8);
  const uint64_t available = bytes.size() - kMetadataHeaderBytes;
  if (length != available) {
    return loss(length > available ? absl::StrCat("truncated: the header announces ", length,
                                                  " body bytes but ", available, " follow it")
                                   : absl::StrCat(available - length, " bytes follow the ", length,
                                                  "-byte body the header announces"));
  }
  const absl::string_view body = bytes.substr(kMetadataHeaderBytes);
  if (Crc32c(body.data(), body.size()) != static_cast<uint32_t>(GetLe(bytes, 20, 4))) {
    return loss(absl::StrCat("body checksum mismatch (", body.size(), " bytes are damaged)"));
  }
  CheckpointMetadata proto;
  if (body.size() > static_cast<size_t>(INT32_MAX) ||
      !proto.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return loss(
        absl::StrCat("the ", body.size(), "-byte body does not parse as a CheckpointMetadata"));
  }
  if (proto.format_version() != kFormatVersion) {
    return loss(absl::StrCat("field format_version is ", proto.format_version(),
                             " but the header says ", version));
  }
  return proto;
}

namespace {

// DataLoss "checkpoint metadata '<path>': <what>".
absl::Status MetadataLoss(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat("checkpoint metadata '", path, "': ", what));
}

// Data file name -> its rank (its index in CheckpointMetadata.files).
using FileIndex = std::map<std::string, int>;

// Checks the fields that size everything else: the format version (FailedPrecondition),
// world_size, block_bytes and the number of data files (DataLoss).
absl::Status CheckTopLevelFields(const CheckpointMetadata& proto, const std::string& path) {
  auto loss = [&](const std::string& what) { return MetadataLoss(path, what); };
  if (proto.format_version() != kFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint metadata '", path, "' has format version ", proto.format_version(),
                     "; this build reads only version ", kFormatVersion));
  }
  constexpr int kMaxWorldSize = 99999;  // DataFileName's five digits
  if (proto.world_size() < 1 || proto.world_size() > kMaxWorldSize) {
    return loss(absl::StrCat("field world_size is ", proto.world_size(), ", not in [1, ",
                             kMaxWorldSize, "]"));
  }
  const int64_t block = proto.block_bytes();
  if (block <= 0 || block > kMaxBlockBytes) {
    return loss(absl::StrCat("field block_bytes is ", block, ", not in [1, ", kMaxBlockBytes, "]"));
  }
  if (proto.files_size() != proto.world_size()) {
    return loss(absl::StrCat("field files lists ", proto.files_size(),
                             " data files for world_size ", proto.world_size()));
  }
  return absl::OkStatus();
}

// Checks that files[r] is rank r's data file with a size >= 0, records the sizes in
// `index` and returns the files' ranks by name.
absl::StatusOr<FileIndex> IndexDataFiles(const CheckpointMetadata& proto, const std::string& path,
                                         MetadataIndex* index) {
  auto loss = [&](const std::string& what) { return MetadataLoss(path, what); };
  const int world = proto.world_size();
  FileIndex file_index;
  for (int r = 0; r < world; ++r) {
    const DataFileProto& f = proto.files(r);
    const std::string expected = DataFileName(r, world);
    if (f.name() != expected || f.rank() != r) {
      return loss(absl::StrCat("files[", r, "] is '", f.name(), "' of rank ", f.rank(),
                               "; expected '", expected, "' of rank ", r));
    }
    if (f.size_bytes() < 0) {
      return loss(absl::StrCat("data file '", f.name(), "': field size_bytes is ", f.size_bytes()));
    }
    index->file_sizes[f.name()] = f.size_bytes();
    file_index[f.name()] = r;
  }
  return file_index;
}

// Checks one chunk `c` (`cw` names it) of a tensor of `numel` `dtype` elements: it starts
// at `next` and ends within the tensor, its byte_length matches its elements, it lies
// within its data file of `file_size` bytes and has one checksum per `block` bytes.
absl::Status CheckChunk(const ChunkProto& c, const std::string& cw, int64_t next, int64_t numel,
                        core::DType dtype, int64_t file_size, int64_t block,
                        const std::string& path) {
  auto loss = [&](const std::string& what) { return MetadataLoss(path, what); };
  if (c.begin() != next) {
    return loss(absl::StrCat(cw, ": field begin: chunks must tile [0, ", numel,
                             ") in order; expected one starting at ", next));
  }
  // begin == next is in [0, numel], so end - begin cannot overflow once end is too.
  if (c.end() <= c.begin() || c.end() > numel) {
    return loss(absl::StrCat(cw, ": field end is not in [", c.begin() + 1, ", ", numel, "]"));
  }
  // At most 2^50 elements of at most 4 bytes: no overflow.
  const int64_t bytes = (c.end() - c.begin()) * core::DTypeSize(dtype);
  if (c.byte_length() != bytes) {
    return loss(absl::StrCat(cw, ": field byte_length is ", c.byte_length(), ", not the ", bytes,
                             " bytes of ", c.end() - c.begin(), " ", core::DTypeName(dtype),
                             " elements"));
  }
  // byte_offset + byte_length <= file_size, written so that it cannot overflow.
  if (c.byte_offset() < 0 || c.byte_offset() > file_size - c.byte_length()) {
    return loss(absl::StrCat(cw, ": field byte_offset ", c.byte_offset(), " with byte_length ",
                             c.byte_length(), " does not lie within the file's ", file_size,
                             " bytes"));
  }
  const int64_t blocks = c.byte_length() / block + (c.byte_length() % block != 0);
  if (c.block_crc32c_size() != blocks) {
    return loss(absl::StrCat(cw, ": field block_crc32c has ", c.block_crc32c_size(),
                             " checksums for ", blocks, " blocks of ", block, " bytes"));
  }
  return absl::OkStatus();
}

// Checks tensor #i (a name of its own, a dtype, a shape of at most 2^50 elements, chunks
// that tile it in order: CheckChunk) and adds it to `index`; each chunk's byte range
// goes to its file's `extents`.
absl::Status IndexTensor(const CheckpointMetadata& proto, int i, const FileIndex& file_index,
                         const std::string& path, MetadataIndex* index,
                         std::vector<std::vector<Extent>>* extents) {
  auto loss = [&](const std::string& what) { return MetadataLoss(path, what); };
  const TensorProto& t = proto.tensors(i);
  const std::string what = absl::StrCat("tensor '", t.name(), "'");
  if (t.name().empty()) return loss(absl::StrCat("tensor #", i, " has no name"));
  if (!index->by_name.emplace(t.name(), i).second) {
    return loss(absl::StrCat(what, " is listed twice"));
  }
  absl::StatusOr<core::DType> dtype = core::ParseDType(t.dtype());
  if (!dtype.ok()) return loss(absl::StrCat(what, ": field dtype: ", dtype.status().message()));
  core::Shape shape(t.shape().begin(), t.shape().end());
  absl::StatusOr<int64_t> numel = CheckedNumel(shape, absl::StrCat(what, ": field shape"));
  if (!numel.ok()) return loss(std::string(numel.status().message()));
  int64_t next = 0;
  for (int k = 0; k < t.chunks_size(); ++k) {
    const ChunkProto& c = t.chunks(k);
    const std::string cw =
        absl::StrCat(what, " chunk #", k, " [", c.begin(), ", ", c.end(), ") in '", c.file(), "'");
    auto f = file_index.find(c.file());
    if (f == file_index.end()) {
      return loss(absl::StrCat(cw, ": field file names no listed data file"));
    }
    RETURN_IF_ERROR(CheckChunk(c, cw, next, *numel, *dtype, proto.files(f->second).size_bytes(),
                               proto.block_bytes(), path));
    (*extents)[f->second].push_back({c.byte_offset(), c.byte_length(), i, k});
    next = c.end();
  }
  if (next != *numel) {
    return loss(absl::StrCat(what, " of shape ", core::ShapeToString(shape), ": elements [", next,
                             ", ", *numel, ") are in no chunk"));
  }
  index->dtypes.push_back(*dtype);
  index->shapes.push_back(std::move(shape));
  index->numels.push_back(*numel);
  return absl::OkStatus();
}

// Checks that data file `f` is exactly its chunks' byte ranges `e` (sorted here), back
// to back: no overlap, no gap, nothing after the last.
absl::Status CheckFileCoverage(const CheckpointMetadata& proto, const DataFileProto& f,
                               std::vector<Extent>& e, const std::string& path) {
  auto loss = [&](const std::string& what) { return MetadataLoss(path, what); };
  std::sort(e.begin(), e.end(), [](const Extent& a, const Extent& b) {
    return std::tie(a.offset, a.length) < std::tie(b.offset, b.length);
  });
  int64_t at = 0;
  for (size_t k = 0; k < e.size(); ++k) {
    const std::string owner =
        absl::StrCat("chunk #", e[k].chunk, " of tensor '", proto.tensors(e[k].tensor).name(), "'");
    if (e[k].offset < at) {
      return loss(absl::StrCat("data file '", f.name(), "': ", owner, " at byte ", e[k].offset,
                               " overlaps the chunk before it, which ends at ", at));
    }
    if (e[k].offset > at) {
      return loss(absl::StrCat("data file '", f.name(), "': bytes [", at, ", ", e[k].offset,
                               ") belong to no chunk (before ", owner, ")"));
    }
    at = e[k].offset + e[k].length;  // <= size_bytes, checked above
  }
  if (at != f.size_bytes()) {
    return loss(absl::StrCat("data file '", f.name(), "': bytes [", at, ", ", f.size_bytes(),
                             ") of its field size_bytes ", f.size_bytes(), " belong to no chunk"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MetadataIndex> IndexMetadata(CheckpointMetadata proto, const std::string& dir,
                                            const std::string& path) {
  RETURN_IF_ERROR(CheckTopLevelFields(proto, path));
  MetadataIndex index;
  index.dir = dir;
  ASSIGN_OR_RETURN(const FileIndex file_index, IndexDataFiles(proto, path, &index));
  std::vector<std::vector<Extent>> extents(proto.world_size());
  for (int i = 0; i < proto.tensors_size(); ++i) {
    RETURN_IF_ERROR(IndexTensor(proto, i, file_index, path, &index, &extents));
  }
  // Whole-file coverage: each file is exactly its chunks, back to back.
  for (int r = 0; r < proto.world_size(); ++r) {
    RETURN_IF_ERROR(CheckFileCoverage(proto, proto.files(r), extents[r], path));
  }
  index.proto = std::move(proto);
  return index;
}

absl::StatusOr<MetadataIndex> ParseMetadataFile(absl::string_view bytes, const std::string& dir,
                                                const std::string& path) {
  ASSIGN_OR_RETURN(CheckpointMetadata proto, DecodeMetadataFile(bytes, path));
  return IndexMetadata(std::move(proto), dir, path);
}

absl::StatusOr<MetadataIndex> ReadMetadataIndex(const std::string& dir) {
  const std::string path = JoinPath(dir, kMetadataFileName);
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  if (absl::IsNotFound(bytes.status())) {
    return absl::NotFoundError(
        absl::StrCat("no checkpoint in directory '", dir, "': '", path, "' does not exist"));
  }
  if (!bytes.ok()) return bytes.status();
  return ParseMetadataFile(*bytes, dir, path);
}

}  // namespace internal
}  // namespace checkpoint
