#include "checkpoint/internal/metadata.h"

#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/internal/file_io.h"
#include "checkpoint/sharded.h"
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
      return absl::InvalidArgumentError(absl::StrCat(what, " has shape ", core::ShapeToString(shape),
                                                     ", more than 2^50 elements"));
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

bool SafeFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace

absl::StatusOr<MetadataIndex> IndexMetadata(CheckpointMetadata proto, const std::string& dir,
                                            const std::string& path) {
  auto loss = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("checkpoint metadata '", path, "': ", what));
  };
  if (proto.format_version() != kFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint metadata '", path, "' has format version ",
                     proto.format_version(), "; this build reads version ",
                     kFormatVersion));
  }
  if (proto.world_size() < 1) return loss(absl::StrCat("world size ", proto.world_size()));
  if (proto.block_bytes() <= 0) return loss(absl::StrCat("block size ", proto.block_bytes()));
  std::set<std::string> files;
  for (const DataFileProto& f : proto.files()) {
    if (!SafeFileName(f.name())) return loss(absl::StrCat("unsafe data file name '", f.name(), "'"));
    files.insert(f.name());
  }

  MetadataIndex index;
  index.dir = dir;
  const int64_t block = proto.block_bytes();
  for (int i = 0; i < proto.tensors_size(); ++i) {
    const TensorProto& t = proto.tensors(i);
    const std::string what = absl::StrCat("tensor '", t.name(), "'");
    if (t.name().empty()) return loss(absl::StrCat("tensor #", i, " has no name"));
    if (!index.by_name.emplace(t.name(), i).second) return loss(absl::StrCat(what, " is listed twice"));
    absl::StatusOr<core::DType> dtype = core::ParseDType(t.dtype());
    if (!dtype.ok()) return loss(absl::StrCat(what, ": ", dtype.status().message()));
    core::Shape shape(t.shape().begin(), t.shape().end());
    absl::StatusOr<int64_t> numel = CheckedNumel(shape, what);
    if (!numel.ok()) return loss(std::string(numel.status().message()));
    const int64_t es = core::DTypeSize(*dtype);
    int64_t next = 0;
    for (const ChunkProto& c : t.chunks()) {
      const std::string cw = absl::StrCat(what, " chunk [", c.begin(), ", ", c.end(), ") in '",
                                          c.file(), "'");
      if (!SafeFileName(c.file())) return loss(absl::StrCat(cw, ": unsafe data file name"));
      if (!files.count(c.file())) return loss(absl::StrCat(cw, ": file not listed"));
      if (c.begin() != next || c.end() < c.begin() || c.end() > *numel) {
        return loss(absl::StrCat(cw, ": chunks must tile [0, ", *numel, ") in order; expected one "
                                 "starting at ", next));
      }
      if (c.byte_offset() < 0 || c.byte_length() != (c.end() - c.begin()) * es) {
        return loss(absl::StrCat(cw, ": byte range at ", c.byte_offset(), " of length ",
                                 c.byte_length(), " does not hold ", c.end() - c.begin(), " ",
                                 core::DTypeName(*dtype), " elements"));
      }
      const int64_t blocks = (c.byte_length() + block - 1) / block;
      if (c.block_crc32c_size() != blocks) {
        return loss(absl::StrCat(cw, ": ", c.block_crc32c_size(), " checksums for ", blocks,
                                 " blocks of ", block, " bytes"));
      }
      next = c.end();
    }
    if (next != *numel) {
      return loss(absl::StrCat(what, " of shape ", core::ShapeToString(shape), ": elements [",
                               next, ", ", *numel, ") are in no chunk"));
    }
    index.dtypes.push_back(*dtype);
    index.shapes.push_back(std::move(shape));
    index.numels.push_back(*numel);
  }
  index.proto = std::move(proto);
  return index;
}

absl::StatusOr<MetadataIndex> ReadMetadataIndex(const std::string& dir) {
  const std::string path = JoinPath(dir, kMetadataFileName);
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  if (absl::IsNotFound(bytes.status())) {
    return absl::NotFoundError(absl::StrCat("no checkpoint in directory '", dir, "': '", path,
                                            "' does not exist"));
  }
  if (!bytes.ok()) return bytes.status();
  CheckpointMetadata proto;
  if (!proto.ParseFromString(*bytes)) {
    return absl::DataLossError(absl::StrCat("checkpoint metadata '", path,
                                            "' does not parse as a CheckpointMetadata (",
                                            bytes->size(), " bytes)"));
  }
  return IndexMetadata(std::move(proto), dir, path);
}

}  // namespace internal
}  // namespace checkpoint
