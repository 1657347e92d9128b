#include "nn/rotary.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace nn {

absl::StatusOr<RotaryTables> MakeRotaryTables(int64_t positions, int64_t head_dim, double theta,
                                              const core::Device& device) {
  if (positions <= 0 || head_dim <= 0 || head_dim % 2 != 0 || !std::isfinite(theta) ||
      theta <= 0.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rotary tables need positions > 0 (got ", positions, "), an even head_dim > 0 (got ",
        head_dim, ") and a finite theta > 0 (got ", theta, ")"));
  }
  const int64_t half = head_dim / 2;
  ASSIGN_OR_RETURN(
      core::Tensor cos,
      core::Tensor::Allocate({positions, half}, core::DType::kFloat32, core::MemoryTag::kOther));
  ASSIGN_OR_RETURN(
      core::Tensor sin,
      core::Tensor::Allocate({positions, half}, core::DType::kFloat32, core::MemoryTag::kOther));
  float* c = cos.data<float>();
  float* s = sin.data<float>();
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / head_dim);
    for (int64_t t = 0; t < positions; ++t) {
      const double angle = static_cast<double>(t) * inv_freq;
      c[t * half + i] = static_cast<float>(std::cos(angle));
      s[t * half + i] = static_cast<float>(std::sin(angle));
    }
  }
  RotaryTables tables;
  tables.head_dim = head_dim;
  tables.theta = theta;
  if (device.is_cpu()) {
    tables.cos = std::move(cos);
    tables.sin = std::move(sin);
  } else {
    ASSIGN_OR_RETURN(tables.cos, cos.To(device, core::MemoryTag::kOther));
    ASSIGN_OR_RETURN(tables.sin, sin.To(device, core::MemoryTag::kOther));
  }
  return tables;
}

}  // namespace nn
