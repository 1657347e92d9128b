// Element types of tensors: fp32, bf16 and int32, with bf16 conversion.
//
//   core::BFloat16 h = core::BFloat16::FromFloat(1.5f);
//   float f = h.ToFloat();                    // 1.5
//   int64_t bytes = core::DTypeSize(core::DType::kBFloat16);  // 2
#ifndef CORE_DTYPE_H_
#define CORE_DTYPE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/bf16_hd.h"

namespace core {

enum class DType { kFloat32, kBFloat16, kInt32 };

// Bytes per element.
int64_t DTypeSize(DType dtype);

// Whether elements of `dtype` are floating point (fp32 or bf16), the types that convert
// into each other.
inline bool IsFloat(DType dtype) { return dtype == DType::kFloat32 || dtype == DType::kBFloat16; }

// "float32", "bfloat16", "int32".
std::string DTypeName(DType dtype);

// Inverse of DTypeName; InvalidArgument naming the unknown string otherwise.
absl::StatusOr<DType> ParseDType(absl::string_view name);

// bfloat16: the upper 16 bits of an IEEE fp32. Conversion from float rounds to
// nearest even (as PyTorch and CUDA do); NaN stays NaN. The conversions are
// core/bf16_hd.h's, the one body the CPU loops and the CUDA kernels share.
struct BFloat16 {
  uint16_t bits = 0;

  static BFloat16 FromFloat(float f) {
    BFloat16 h;
    h.bits = FloatToBf16Bits(f);
    return h;
  }

  float ToFloat() const { return Bf16BitsToFloat(bits); }
};

static_assert(sizeof(BFloat16) == 2, "BFloat16 must be two bytes");

}  // namespace core

#endif  // CORE_DTYPE_H_
