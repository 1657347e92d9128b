// Element types of tensors: fp32, bf16 and int32, with bf16 conversion.
//
//   core::BFloat16 h = core::BFloat16::FromFloat(1.5f);
//   float f = h.ToFloat();                    // 1.5
//   int64_t bytes = core::DTypeSize(core::DType::kBFloat16);  // 2
#ifndef CORE_DTYPE_H_
#define CORE_DTYPE_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace core {

enum class DType { kFloat32, kBFloat16, kInt32 };

// Bytes per element.
int64_t DTypeSize(DType dtype);

// "float32", "bfloat16", "int32".
std::string DTypeName(DType dtype);

// Inverse of DTypeName; InvalidArgument naming the unknown string otherwise.
absl::StatusOr<DType> ParseDType(absl::string_view name);

// bfloat16: the upper 16 bits of an IEEE fp32. Conversion from float rounds to
// nearest even (as PyTorch and CUDA do); NaN stays NaN.
struct BFloat16 {
  uint16_t bits = 0;

  static BFloat16 FromFloat(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    BFloat16 h;
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
      h.bits = static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
      return h;
    }
    const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
    h.bits = static_cast<uint16_t>((u + rounding_bias) >> 16);
    return h;
  }

  float ToFloat() const {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
  }
};

static_assert(sizeof(BFloat16) == 2, "BFloat16 must be two bytes");

}  // namespace core

#endif  // CORE_DTYPE_H_
