#include "core/dtype.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace core {
namespace {

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2);
  EXPECT_EQ(DTypeSize(DType::kInt32), 4);
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kInt32}) {
    EXPECT_EQ(*ParseDType(DTypeName(d)), d);
  }
  EXPECT_EQ(ParseDType("float16").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BFloat16Test, ExactValuesRoundTrip) {
  for (float f : {0.0f, 1.0f, -2.0f, 0.5f, 1.5f, 65536.0f, -0.125f}) {
    EXPECT_EQ(BFloat16::FromFloat(f).ToFloat(), f);
  }
}

TEST(BFloat16Test, RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(BFloat16::FromFloat(1.0f + std::ldexp(1.0f, -8)).ToFloat(), 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(BFloat16::FromFloat(1.0f + 3 * std::ldexp(1.0f, -8)).ToFloat(),
            1.0f + std::ldexp(1.0f, -6));
  // Just above halfway rounds up.
  EXPECT_EQ(BFloat16::FromFloat(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)).ToFloat(),
            1.0f + std::ldexp(1.0f, -7));
}

TEST(BFloat16Test, RelativeErrorBounded) {
  // 8 significant bits (7 stored + the implicit one): ulp is 2^-7 relative to the
  // leading power of two, so round-to-nearest errs by at most half of it, 2^-8 of |f|.
  for (float f = -100.0f; f < 100.0f; f += 0.37f) {
    if (f == 0.0f) continue;
    const float r = BFloat16::FromFloat(f).ToFloat();
    EXPECT_LE(std::fabs(r - f), std::fabs(f) * std::ldexp(1.0f, -8)) << f;
  }
}

TEST(BFloat16Test, NanAndInfinity) {
  EXPECT_TRUE(std::isnan(BFloat16::FromFloat(std::numeric_limits<float>::quiet_NaN()).ToFloat()));
  EXPECT_TRUE(std::isinf(BFloat16::FromFloat(std::numeric_limits<float>::infinity()).ToFloat()));
}

}  // namespace
}  // namespace core
