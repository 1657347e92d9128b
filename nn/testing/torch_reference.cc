#include "nn/testing/torch_reference.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace nn {
namespace torch_ref {

absl::StatusOr<const ReferenceTensor*> ReferenceFile::Get(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) return absl::NotFoundError(absl::StrCat("no tensor '", name, "'"));
  return &it->second;
}

absl::StatusOr<std::string> ReferenceFile::Field(const std::string& key) const {
  auto it = metadata.find(key);
  if (it == metadata.end()) return absl::NotFoundError(absl::StrCat("no metadata '", key, "'"));
  return it->second;
}

namespace {

// Element i of `bytes` (little-endian, as this x86-64 host stores them) as double.
double Element(const std::string& dtype, const char* bytes, int64_t i) {
  if (dtype == "F64") {
    double v;
    std::memcpy(&v, bytes + 8 * i, 8);
    return v;
  }
  if (dtype == "F32") {
    float v;
    std::memcpy(&v, bytes + 4 * i, 4);
    return v;
  }
  int32_t v;
  std::memcpy(&v, bytes + 4 * i, 4);
  return v;
}

}  // namespace

absl::StatusOr<ReferenceFile> ReadReferenceFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
  };
  uint64_t header_len = 0;
  if (bytes.size() < 8) return bad("shorter than the 8-byte header length");
  std::memcpy(&header_len, bytes.data(), 8);
  if (header_len > bytes.size() - 8) return bad("header longer than the file");
  const size_t data_begin = 8 + header_len;
  ReferenceFile file;
  try {
    const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_len));
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        for (const auto& [key, value] : entry.items()) file.metadata[key] = value.get<std::string>();
        continue;
      }
      ReferenceTensor t;
      t.dtype = entry.at("dtype").get<std::string>();
      if (t.dtype != "F64" && t.dtype != "F32" && t.dtype != "I32") {
        return bad(absl::StrCat("tensor '", name, "' has dtype ", t.dtype));
      }
      const int64_t size = t.dtype == "F64" ? 8 : 4;
      int64_t numel = 1;
      for (const auto& d : entry.at("shape")) {
        t.shape.push_back(d.get<int64_t>());
        numel *= t.shape.back();
      }
      const uint64_t begin = entry.at("data_offsets").at(0).get<uint64_t>();
      const uint64_t end = entry.at("data_offsets").at(1).get<uint64_t>();
      if (end < begin || end - begin != static_cast<uint64_t>(numel * size) ||
          end > bytes.size() - data_begin) {
        return bad(absl::StrCat("tensor '", name, "' has offsets [", begin, ", ", end,
                                ") for ", numel, " elements"));
      }
      t.values.resize(static_cast<size_t>(numel));
      for (int64_t i = 0; i < numel; ++i) {
        t.values[i] = Element(t.dtype, bytes.data() + data_begin + begin, i);
      }
      file.tensors[name] = std::move(t);
    }
  } catch (const nlohmann::json::exception& e) {
    return bad(absl::StrCat("malformed header: ", e.what()));
  }
  return file;
}

}  // namespace torch_ref
}  // namespace nn
