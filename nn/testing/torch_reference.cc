#include "nn/testing/torch_reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
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

absl::StatusOr<int64_t> ReferenceFile::Int(const std::string& key) const {
  ASSIGN_OR_RETURN(const std::string text, Field(key));
  int64_t v;
  if (!absl::SimpleAtoi(text, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("metadata '", key, "' is '", text, "'"));
  }
  return v;
}

absl::StatusOr<double> ReferenceFile::Double(const std::string& key) const {
  ASSIGN_OR_RETURN(const std::string text, Field(key));
  double v;
  if (!absl::SimpleAtod(text, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("metadata '", key, "' is '", text, "'"));
  }
  return v;
}

absl::StatusOr<core::Tensor> ReferenceFile::Ints(const std::string& name) const {
  ASSIGN_OR_RETURN(const ReferenceTensor* t, Get(name));
  if (t->dtype != "I32") {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is ", t->dtype));
  }
  const std::vector<int32_t> ids(t->values.begin(), t->values.end());
  return core::Tensor::FromInts(ids, t->shape);
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
        for (const auto& [key, value] : entry.items()) {
          file.metadata[key] = value.get<std::string>();
        }
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
        return bad(absl::StrCat("tensor '", name, "' has offsets [", begin, ", ", end, ") for ",
                                numel, " elements"));
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

absl::Status LoadParameters(const ReferenceFile& f,
                            const std::vector<core::NamedParameter>& params) {
  std::set<std::string> ours;
  for (const auto& [name, p] : params) {
    ours.insert(name);
    absl::StatusOr<const ReferenceTensor*> w = f.Get("param." + name);
    if (!w.ok()) return absl::InvalidArgumentError(w.status().message());
    if ((*w)->dtype != "F32" || (*w)->shape != p->data.shape() ||
        p->data.dtype() != core::DType::kFloat32 || !p->data.device().is_cpu()) {
      return absl::InvalidArgumentError(absl::StrCat("param.", name, " is ", (*w)->dtype, " ",
                                                     core::ShapeToString((*w)->shape), "; ours is ",
                                                     p->data.ToString()));
    }
    float* dst = p->data.data<float>();
    for (size_t i = 0; i < (*w)->values.size(); ++i) dst[i] = static_cast<float>((*w)->values[i]);
  }
  for (const auto& [key, t] : f.tensors) {
    if (key.rfind("param.", 0) == 0 && ours.count(key.substr(6)) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the file's ", key, " is no parameter of ours"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<GradientComparison> CompareGradients(
    const ReferenceFile& f, const std::vector<core::NamedParameter>& params) {
  GradientComparison out;
  for (const auto& [name, p] : params) {
    absl::StatusOr<const ReferenceTensor*> g = f.Get("grad." + name);
    if (!g.ok()) return absl::InvalidArgumentError(g.status().message());
    if ((*g)->dtype != "F64" || !p->grad.defined() ||
        p->grad.numel() != static_cast<int64_t>((*g)->values.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "grad.", name, " is ", (*g)->dtype, " ", core::ShapeToString((*g)->shape), "; ours is ",
          p->grad.defined() ? p->grad.ToString() : std::string("undefined")));
    }
    const std::vector<float> ours = p->grad.ToVector();
    GradientError e;
    e.name = name;
    double max_diff = 0;
    for (size_t i = 0; i < ours.size(); ++i) {
      e.max_reference = std::max(e.max_reference, std::abs((*g)->values[i]));
      max_diff = std::max(max_diff, std::abs(ours[i] - (*g)->values[i]));
    }
    e.ratio = max_diff / e.max_reference;
    if (out.params.empty() || e.ratio >= out.worst.ratio) out.worst = e;
    out.params.push_back(std::move(e));
  }
  return out;
}

absl::StatusOr<Comparison> RunAndCompare(const ReferenceFile& f,
                                         const std::vector<core::NamedParameter>& params,
                                         const std::function<absl::StatusOr<Scalars>()>& run) {
  RETURN_IF_ERROR(LoadParameters(f, params));
  ASSIGN_OR_RETURN(const Scalars ours, run());
  Comparison out;
  for (const auto& [name, value] : ours) {
    absl::StatusOr<const ReferenceTensor*> t = f.Get(name);
    if (!t.ok()) return absl::InvalidArgumentError(t.status().message());
    if ((*t)->dtype != "F64" || (*t)->values.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " is ", (*t)->dtype, " ", core::ShapeToString((*t)->shape), "; ours is a scalar"));
    }
    ScalarError e;
    e.name = name;
    e.ours = value;
    e.reference = (*t)->values[0];
    e.relative = std::abs(value - e.reference) / std::abs(e.reference);
    out.scalars.push_back(std::move(e));
  }
  ASSIGN_OR_RETURN(out.grads, CompareGradients(f, params));
  return out;
}

std::string Summary(const Comparison& c) {
  std::vector<std::string> parts;
  for (const ScalarError& s : c.scalars) {
    parts.push_back(absl::StrFormat("%s %.10f vs float64 %.10f: relative error %.2e", s.name,
                                    s.ours, s.reference, s.relative));
  }
  parts.push_back(absl::StrFormat("worst of %d gradients %s: max |diff| / max |ref| = %.2e",
                                  c.grads.params.size(), c.grads.worst.name, c.grads.worst.ratio));
  return absl::StrJoin(parts, "; ");
}

void ExpectMatches(const Comparison& c, double scalar_rel, double grad_ratio,
                   const std::string& label) {
  std::printf("%s: %s\n", label.c_str(), Summary(c).c_str());
  for (const ScalarError& s : c.scalars) {
    ::testing::Test::RecordProperty(absl::StrCat(s.name, "_relative_error"),
                                    absl::StrCat(s.relative));
    EXPECT_LE(s.relative, scalar_rel) << label << ": " << s.name;
  }
  ::testing::Test::RecordProperty("worst_gradient_ratio", absl::StrCat(c.grads.worst.ratio));
  for (const GradientError& g : c.grads.params) {
    EXPECT_GT(g.max_reference, 0.0) << label << ": " << g.name;
    EXPECT_LE(g.ratio, grad_ratio)
        << label << ": gradient of " << g.name << ", max |ref| " << g.max_reference;
  }
}

}  // namespace torch_ref
}  // namespace nn
