#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/internal/file_io.h"
#include "checkpoint/internal/host_staging.h"
#include "core/status_macros.h"
#include "core/text_file.h"
#include "nlohmann/json.hpp"

namespace checkpoint {
namespace {

using Json = nlohmann::ordered_json;

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.cc writes host-order elements; it needs a little-endian host"
#endif

constexpr char kMetadataKey[] = "__metadata__";

// Element counts above this are refused (core::Tensor's bound).
constexpr uint64_t kMaxNumel = uint64_t{1} << 50;

std::string Quoted(absl::string_view s) { return absl::StrCat("'", s, "'"); }

}  // namespace

std::string SafetensorsDTypeName(core::DType dtype) {
  switch (dtype) {
    case core::DType::kFloat32:
      return "F32";
    case core::DType::kBFloat16:
      return "BF16";
    case core::DType::kInt32:
      return "I32";
  }
  return "?";
}

absl::StatusOr<core::DType> ParseSafetensorsDType(absl::string_view name) {
  if (name == "F32") return core::DType::kFloat32;
  if (name == "BF16") return core::DType::kBFloat16;
  if (name == "I32") return core::DType::kInt32;
  static const char* const kOthers[] = {
      "BOOL", "U8",      "I8",      "I16",     "U16", "F16",     "U32",     "I64",  "U64",
      "F64",  "F8_E5M2", "F8_E4M3", "F8_E8M0", "F4",  "F6_E2M3", "F6_E3M2", "E8M0", "C64"};
  for (const char* other : kOthers) {
    if (name == other) {
      return absl::UnimplementedError(absl::StrCat(
          "safetensors dtype ", Quoted(name), " is valid but not supported (F32, BF16, I32 are)"));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown safetensors dtype ", Quoted(name)));
}

absl::Status ExportSafetensors(const std::string& path, const NamedTensors& tensors,
                               const std::map<std::string, std::string>& metadata) {
  const std::string where = absl::StrCat("ExportSafetensors(", Quoted(path), ")");
  Json header = Json::object();
  if (!metadata.empty()) {
    Json m = Json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header[kMetadataKey] = std::move(m);
  }
  std::set<std::string> names;
  // Host bytes of each tensor: CPU tensors in place, device tensors through pinned
  // buffers (internal/host_staging.h); the file does not record the device.
  std::vector<internal::HostBytes> data;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const std::string what = absl::StrCat(where, ": tensor ", Quoted(name));
    if (name.empty())
      return absl::InvalidArgumentError(absl::StrCat(where, ": a tensor has an empty name"));
    if (name == kMetadataKey) {
      return absl::InvalidArgumentError(absl::StrCat(what, " uses the reserved name"));
    }
    if (!names.insert(name).second)
      return absl::InvalidArgumentError(absl::StrCat(what, " is listed twice"));
    if (!t.defined()) return absl::InvalidArgumentError(absl::StrCat(what, " is undefined"));
    ASSIGN_OR_RETURN(internal::HostBytes cpu, internal::HostBytes::Of(t, t.dtype(), what));
    const uint64_t n = static_cast<uint64_t>(cpu.nbytes());
    Json entry = Json::object();
    entry["dtype"] = SafetensorsDTypeName(t.dtype());
    Json shape = Json::array();
    for (int64_t d : t.shape()) shape.push_back(static_cast<uint64_t>(d));
    entry["shape"] = std::move(shape);
    entry["data_offsets"] = Json::array({offset, offset + n});
    header[name] = std::move(entry);
    offset += n;
    data.push_back(std::move(cpu));
  }
  std::string text;
  try {
    text = header.dump(-1, ' ', false, Json::error_handler_t::strict);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": a tensor name or metadata string is not valid UTF-8: ", e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char length[8];
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(n >> (8 * i));

  std::vector<absl::string_view> pieces = {
      absl::string_view(reinterpret_cast<const char*>(length), sizeof(length)), text};
  for (const internal::HostBytes& t : data) {
    pieces.emplace_back(static_cast<const char*>(t.data()), static_cast<size_t>(t.nbytes()));
  }
  return core::Annotate(core::WriteFileAtomically(path, pieces), where);
}

std::map<std::string, core::Shape> ParameterShapes(const core::Module& module) {
  std::map<std::string, core::Shape> out;
  for (const auto& [name, p] : module.NamedParameters()) out[name] = p->data.shape();
  return out;
}

absl::Status ExportSafetensors(const std::string& path, const core::Module& module,
                               const std::map<std::string, std::string>& metadata,
                               const std::map<std::string, core::Shape>& full_shapes) {
  NamedTensors tensors;
  for (const auto& [name, p] : module.NamedParameters()) {
    const std::string what = absl::StrCat("ExportSafetensors(", Quoted(path), ") of ",
                                          module.Describe(), ": parameter ", Quoted(name));
    if (!p->data.defined())
      return absl::FailedPreconditionError(absl::StrCat(what, " has no data"));
    if (!full_shapes.empty()) {
      auto it = full_shapes.find(name);
      if (it == full_shapes.end()) {
        return absl::FailedPreconditionError(absl::StrCat(what, " has no entry in full_shapes"));
      }
      if (p->data.shape() != it->second) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, " holds ", core::ShapeToString(p->data.shape()), ", not its full shape ",
            core::ShapeToString(it->second), " (is it sharded? gather the full parameters first)"));
      }
    }
    tensors.emplace_back(name, p->data);
  }
  return ExportSafetensors(path, tensors, metadata);
}

const core::Tensor* SafetensorsFile::Find(const std::string& name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return &t;
  }
  return nullptr;
}

namespace {

// One header entry, validated on its own.
struct Entry {
  std::string name;
  core::DType dtype;  // of the tensor read (kFloat32 for an F16 entry)
  bool f16 = false;   // stored as IEEE half precision, widened on read
  core::Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// The float an IEEE 754 half-precision value stands for (every one is exact in float: normals,
// subnormals, signed zeros, infinities; a NaN keeps its sign and payload's high bits).
float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // a subnormal, mantissa x 2^-24: normalised
    uint32_t shifts = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shifts;
    }
    bits = sign | ((113 - shifts) << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

absl::StatusOr<uint64_t> NonNegativeInt(const Json& v, const std::string& what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0)
    return static_cast<uint64_t>(v.get<int64_t>());
  return absl::InvalidArgumentError(
      absl::StrCat(what, " is ", v.dump(), ", not a non-negative integer"));
}

absl::StatusOr<Entry> ParseEntry(const std::string& name, const Json& v, const std::string& where) {
  const std::string what = absl::StrCat(where, ": tensor ", Quoted(name));
  if (!v.is_object())
    return absl::InvalidArgumentError(absl::StrCat(what, " is not a JSON object"));
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!v.contains(key))
      return absl::InvalidArgumentError(absl::StrCat(what, " has no \"", key, "\""));
  }
  Entry e;
  e.name = name;
  const Json& dtype = v["dtype"];
  if (!dtype.is_string())
    return absl::InvalidArgumentError(absl::StrCat(what, ": \"dtype\" is not a string"));
  // F16 (many published checkpoints) is read widened to F32, exactly.
  e.f16 = dtype.get<std::string>() == "F16";
  absl::StatusOr<core::DType> d =
      e.f16 ? core::DType::kFloat32 : ParseSafetensorsDType(dtype.get<std::string>());
  if (!d.ok()) return core::Annotate(d.status(), what);
  e.dtype = *d;
  const Json& shape = v["shape"];
  if (!shape.is_array())
    return absl::InvalidArgumentError(absl::StrCat(what, ": \"shape\" is not an array"));
  uint64_t numel = 1;
  for (const Json& dim : shape) {
    ASSIGN_OR_RETURN(uint64_t n, NonNegativeInt(dim, absl::StrCat(what, ": a \"shape\" entry")));
    if (n != 0 && numel > kMaxNumel / n) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": shape ", shape.dump(), " has more than 2^50 elements"));
    }
    numel *= n;
    e.shape.push_back(static_cast<int64_t>(n));
  }
  const Json& offsets = v["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": \"data_offsets\" is ", offsets.dump(), ", not [begin, end]"));
  }
  ASSIGN_OR_RETURN(e.begin, NonNegativeInt(offsets[0], absl::StrCat(what, ": data_offsets[0]")));
  ASSIGN_OR_RETURN(e.end, NonNegativeInt(offsets[1], absl::StrCat(what, ": data_offsets[1]")));
  if (e.end < e.begin) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": data_offsets [", e.begin, ", ", e.end, "] end before they begin"));
  }
  const uint64_t nbytes = numel * static_cast<uint64_t>(e.f16 ? 2 : core::DTypeSize(e.dtype));
  if (e.end - e.begin != nbytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": shape ", core::ShapeToString(e.shape), " of ", dtype.get<std::string>(), " is ",
        nbytes, " bytes but data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin));
  }
  return e;
}

}  // namespace

namespace {

// Where a safetensors file's bytes come from: a file, or memory.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to `n` bytes at `offset`; fewer only at the end.
  virtual absl::StatusOr<size_t> ReadAt(int64_t offset, size_t n, void* out) const = 0;
};

class FileSource : public ByteSource {
 public:
  explicit FileSource(const internal::FileReader& file) : file_(file) {}
  absl::StatusOr<size_t> ReadAt(int64_t offset, size_t n, void* out) const override {
    return file_.ReadAt(offset, n, out);
  }

 private:
  const internal::FileReader& file_;
};

class MemorySource : public ByteSource {
 public:
  explicit MemorySource(absl::string_view bytes) : bytes_(bytes) {}
  absl::StatusOr<size_t> ReadAt(int64_t offset, size_t n, void* out) const override {
    if (offset < 0 || static_cast<uint64_t>(offset) >= bytes_.size()) return size_t{0};
    const size_t got = std::min(n, bytes_.size() - static_cast<size_t>(offset));
    if (got > 0) std::memcpy(out, bytes_.data() + offset, got);
    return got;
  }

 private:
  absl::string_view bytes_;
};

}  // namespace

// A file's validated layout: its entries in data-offset order, its metadata and where
// the byte buffer starts.
struct SafetensorsLayout {
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;
};

namespace {

// The JSON header's text: the 8-byte little-endian length, then that many bytes, which
// must lie within the `file_size` bytes and start with '{'.
absl::StatusOr<std::string> ReadHeaderText(const ByteSource& file, const int64_t file_size,
                                           const std::string& where) {
  unsigned char length[8];
  ASSIGN_OR_RETURN(size_t got, file.ReadAt(0, 8, length));
  if (got < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": the file has ", file_size, " bytes, fewer than the 8 of the header length"));
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(length[i]) << (8 * i);
  if (n > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": header length ", n,
                                                   " exceeds the limit of ",
                                                   kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (8 + n > static_cast<uint64_t>(file_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": header length ", n, " reaches past the end of the ", file_size, "-byte file"));
  }
  std::string text(static_cast<size_t>(n), '\0');
  ASSIGN_OR_RETURN(got, file.ReadAt(8, text.size(), text.data()));
  if (got < text.size()) {
    return absl::DataLossError(absl::StrCat(where, ": the file shrank while being read"));
  }
  if (text.empty() || text[0] != '{') {
    return absl::InvalidArgumentError(absl::StrCat(where, ": the header does not start with '{'"));
  }
  return text;
}

// Parses the header `text` into `header`: valid JSON, a JSON object, no key twice in
// any of its objects.
absl::Status ParseHeaderJson(const std::string& text, const std::string& where, Json* header) {
  // Parse, noting duplicate keys in any object (the JSON library would keep just one).
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  Json::parser_callback_t note_keys = [&](int, Json::parse_event_t event, Json& parsed) {
    using E = Json::parse_event_t;
    if (event == E::object_start) open_objects.emplace_back();
    if (event == E::object_end && !open_objects.empty()) open_objects.pop_back();
    if (event == E::key && !open_objects.empty() && duplicate.empty() &&
        !open_objects.back().insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  try {
    *header = Json::parse(text, note_keys);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the header is not valid JSON: ", e.what()));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the header lists ", Quoted(duplicate), " twice"));
  }
  if (!header->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": the header is not a JSON object"));
  }
  return absl::OkStatus();
}

// Reads the header's items into `out`: "__metadata__" (an object of strings) into its
// metadata, each other one (ParseEntry) into its entries, in the header's order.
absl::Status ReadHeaderItems(const Json& header, const std::string& where, SafetensorsLayout* out) {
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": \"__metadata__\" is not a JSON object"));
      }
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": \"__metadata__\" entry ", Quoted(mk), " is not a string"));
        }
        out->metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    ASSIGN_OR_RETURN(Entry e, ParseEntry(key, value, where));
    out->entries.push_back(std::move(e));
  }
  return absl::OkStatus();
}

// Sorts `entries` by data offsets and checks that they tile the `available` bytes of
// the byte buffer exactly: no overlap, no gap, no truncation, nothing after them.
absl::Status SortAndCheckOffsets(std::vector<Entry>& entries, uint64_t available,
                                 const std::string& where) {
  // The offsets must tile the byte buffer in order: no overlap, no gap.
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    if (e.begin != expected) {
      const std::string prev =
          i == 0 ? std::string("the start of the buffer")
                 : absl::StrCat("tensor ", Quoted(entries[i - 1].name), " ending at ", expected);
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tensor ", Quoted(e.name), " data_offsets [", e.begin, ", ", e.end,
                       "] ", e.begin < expected ? "overlap " : "leave a gap after ", prev));
    }
    expected = e.end;
  }
  if (expected > available) {
    std::string tensor;
    for (const Entry& e : entries) {
      if (e.end > available) {
        tensor = e.name;
        break;
      }
    }
    return absl::DataLossError(absl::StrCat(where, ": the file is truncated: tensor ",
                                            Quoted(tensor), " needs buffer bytes up to ", expected,
                                            " but only ", available, " follow the header"));
  }
  if (expected < available) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", available - expected, " bytes follow the last tensor's data"));
  }
  return absl::OkStatus();
}

// The layout of any source of `file_size` bytes, every check of ImportSafetensors made;
// `where` opens every message.
absl::StatusOr<SafetensorsLayout> ParseLayout(const ByteSource& file, const int64_t file_size,
                                              const std::string& where) {
  ASSIGN_OR_RETURN(const std::string text, ReadHeaderText(file, file_size, where));
  Json header;
  RETURN_IF_ERROR(ParseHeaderJson(text, where, &header));
  SafetensorsLayout out;
  RETURN_IF_ERROR(ReadHeaderItems(header, where, &out));
  const uint64_t data_start = 8 + text.size();
  const uint64_t available = static_cast<uint64_t>(file_size) - data_start;
  RETURN_IF_ERROR(SortAndCheckOffsets(out.entries, available, where));
  out.data_start = data_start;
  return out;
}

// One entry's tensor, read into fresh CPU memory counted under `tag`.
absl::StatusOr<core::Tensor> ReadEntry(const ByteSource& file, uint64_t data_start, const Entry& e,
                                       const std::string& where, core::MemoryTag tag) {
  absl::StatusOr<core::Tensor> t = core::Tensor::Allocate(e.shape, e.dtype, tag);
  if (!t.ok()) {
    return core::Annotate(t.status(), absl::StrCat(where, ": tensor ", Quoted(e.name)));
  }
  const size_t nbytes = static_cast<size_t>(e.end - e.begin);
  std::vector<uint16_t> halves(e.f16 ? nbytes / 2 : 0);
  void* into = e.f16 ? static_cast<void*>(halves.data()) : t->raw_data();
  ASSIGN_OR_RETURN(size_t got,
                   file.ReadAt(static_cast<int64_t>(data_start + e.begin), nbytes, into));
  if (got < nbytes) {
    return absl::DataLossError(
        absl::StrCat(where, ": tensor ", Quoted(e.name), ": the file shrank while being read"));
  }
  if (e.f16) {  // little-endian, as the format and this library's hosts are
    float* out = t->data<float>();
    for (size_t i = 0; i < halves.size(); ++i) out[i] = HalfToFloat(halves[i]);
  }
  return *std::move(t);
}

// ImportSafetensors over any source of `file_size` bytes.
absl::StatusOr<SafetensorsFile> ParseSource(const ByteSource& file, const int64_t file_size,
                                            const std::string& where, core::MemoryTag tag) {
  ASSIGN_OR_RETURN(SafetensorsLayout layout, ParseLayout(file, file_size, where));
  SafetensorsFile out;
  out.metadata = std::move(layout.metadata);
  for (const Entry& e : layout.entries) {
    ASSIGN_OR_RETURN(core::Tensor t, ReadEntry(file, layout.data_start, e, where, tag));
    out.tensors.emplace_back(e.name, std::move(t));
    out.stored_dtypes.push_back(e.f16 ? "F16" : SafetensorsDTypeName(e.dtype));
  }
  return out;
}

}  // namespace

absl::StatusOr<SafetensorsFile> ImportSafetensors(const std::string& path, core::MemoryTag tag) {
  const std::string where = absl::StrCat("ImportSafetensors(", Quoted(path), ")");
  absl::StatusOr<internal::FileReader> opened = internal::FileReader::Open(path);
  if (!opened.ok()) {
    return core::Annotate(opened.status(), where);
  }
  absl::StatusOr<int64_t> size = opened->Size();
  if (!size.ok()) return core::Annotate(size.status(), where);
  return ParseSource(FileSource(*opened), *size, where, tag);
}

absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view bytes, const std::string& name,
                                                 core::MemoryTag tag) {
  const std::string where = absl::StrCat("ParseSafetensors(", Quoted(name), ")");
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": too many bytes"));
  }
  return ParseSource(MemorySource(bytes), static_cast<int64_t>(bytes.size()), where, tag);
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&&) noexcept = default;
SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&&) noexcept = default;
SafetensorsReader::~SafetensorsReader() = default;
SafetensorsReader::SafetensorsReader() = default;

absl::StatusOr<SafetensorsReader> SafetensorsReader::Open(const std::string& path) {
  const std::string where = absl::StrCat("SafetensorsReader(", Quoted(path), ")");
  absl::StatusOr<internal::FileReader> opened = internal::FileReader::Open(path);
  if (!opened.ok()) {
    return core::Annotate(opened.status(), where);
  }
  absl::StatusOr<int64_t> size = opened->Size();
  if (!size.ok()) return core::Annotate(size.status(), where);
  SafetensorsReader reader;
  reader.file_ = std::make_unique<internal::FileReader>(*std::move(opened));
  ASSIGN_OR_RETURN(SafetensorsLayout layout, ParseLayout(FileSource(*reader.file_), *size, where));
  reader.layout_ = std::make_unique<SafetensorsLayout>(std::move(layout));
  reader.where_ = where;
  return reader;
}

std::vector<std::string> SafetensorsReader::Names() const {
  std::vector<std::string> names;
  for (const Entry& e : layout_->entries) names.push_back(e.name);
  return names;
}

const std::map<std::string, std::string>& SafetensorsReader::metadata() const {
  return layout_->metadata;
}

absl::StatusOr<core::Shape> SafetensorsReader::ShapeOf(const std::string& name) const {
  for (const Entry& e : layout_->entries) {
    if (e.name == name) return e.shape;
  }
  return absl::NotFoundError(absl::StrCat(where_, ": no tensor ", Quoted(name)));
}

absl::StatusOr<core::Tensor> SafetensorsReader::Read(const std::string& name,
                                                     core::MemoryTag tag) const {
  for (const Entry& e : layout_->entries) {
    if (e.name == name) return ReadEntry(FileSource(*file_), layout_->data_start, e, where_, tag);
  }
  return absl::NotFoundError(absl::StrCat(where_, ": no tensor ", Quoted(name)));
}

absl::Status ImportSafetensorsInto(const std::string& path, core::Module& module, bool strict) {
  ASSIGN_OR_RETURN(SafetensorsFile file, ImportSafetensors(path, core::MemoryTag::kOther));
  const std::string where =
      absl::StrCat("ImportSafetensorsInto(", Quoted(path), ", ", module.Describe(), ")");
  std::map<std::string, const core::Tensor*> by_name;
  for (const auto& [name, t] : file.tensors) by_name[name] = &t;
  const auto params = module.NamedParameters();
  std::set<std::string> used;
  // Check everything first, so nothing changes on error.
  for (const auto& [name, p] : params) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      return absl::NotFoundError(
          absl::StrCat(where, ": parameter ", Quoted(name), " is not in the file"));
    }
    const core::Tensor& src = *it->second;
    if (!p->data.defined() || p->data.shape() != src.shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": parameter ", Quoted(name), " has shape ",
          p->data.defined() ? core::ShapeToString(p->data.shape()) : std::string("<undefined>"),
          " but the file's tensor has ", core::ShapeToString(src.shape())));
    }
    const bool convertible =
        src.dtype() == p->data.dtype() ||
        (src.dtype() != core::DType::kInt32 && p->data.dtype() != core::DType::kInt32);
    if (!convertible) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": parameter ", Quoted(name), " is ", core::DTypeName(p->data.dtype()),
          " but the file has ", core::DTypeName(src.dtype())));
    }
    used.insert(name);
  }
  if (strict) {
    for (const auto& [name, t] : file.tensors) {
      if (!used.count(name)) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": the file's tensor ", Quoted(name),
                                                       " matches no parameter (strict)"));
      }
    }
  }
  for (const auto& [name, p] : params) {
    // A device parameter is filled through a pinned buffer (internal/host_staging.h).
    RETURN_IF_ERROR(internal::CopyHostToTensor(p->data, *by_name.at(name),
                                               absl::StrCat(where, ": parameter ", Quoted(name))));
  }
  return absl::OkStatus();
}

}  // namespace checkpoint
