#include "core/dtype.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace core {

int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kBFloat16:
      return 2;
    case DType::kInt32:
      return 4;
  }
  return 0;
}

std::string DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt32:
      return "int32";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  if (name == "float32" || name == "fp32") return DType::kFloat32;
  if (name == "bfloat16" || name == "bf16") return DType::kBFloat16;
  if (name == "int32") return DType::kInt32;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "'; expected float32, bfloat16 or int32"));
}

}  // namespace core
