#include "core/bf16_hd.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace core {
namespace {

float F(uint32_t bits) { return BitsToFloat(bits); }

// An independent reference for the rounding: of the two bf16 values around finite `f`
// (its truncation and the next one away from zero, 2^128 past the largest), the nearer
// in exact (double) arithmetic, the even one on a tie. NaNs are left to the caller.
uint16_t ReferenceBf16Bits(float f) {
  const uint32_t u = FloatToBits(f);
  const uint32_t down = u & 0xffff0000u;
  const uint32_t up = down + 0x10000u;
  const double x = std::fabs(static_cast<double>(f));
  const double below = std::fabs(static_cast<double>(F(down)));
  const double above = (up & 0x7fffffffu) == 0x7f800000u ? std::ldexp(1.0, 128)
                                                         : std::fabs(static_cast<double>(F(up)));
  const double to_below = x - below;
  const double to_above = above - x;
  if (to_below < to_above) return static_cast<uint16_t>(down >> 16);
  if (to_above < to_below) return static_cast<uint16_t>(up >> 16);
  return static_cast<uint16_t>(((down >> 16) & 1u) == 0 ? down >> 16 : up >> 16);
}

TEST(Bf16HdTest, RoundsToNearestEven) {
  // 1.0 + half an ulp of bf16 (2^-8): a tie, rounds to the even 1.0.
  EXPECT_EQ(FloatToBf16Bits(F(0x3f808000u)), 0x3f80);
  // 1.0 + 3/2 ulp: a tie between 0x3f81 (odd) and 0x3f82 (even): rounds up to even.
  EXPECT_EQ(FloatToBf16Bits(F(0x3f818000u)), 0x3f82);
  // Just above and below the tie.
  EXPECT_EQ(FloatToBf16Bits(F(0x3f808001u)), 0x3f81);
  EXPECT_EQ(FloatToBf16Bits(F(0x3f807fffu)), 0x3f80);
  EXPECT_EQ(FloatToBf16Bits(1.0f / 3.0f), 0x3eab);
  EXPECT_EQ(Bf16BitsToFloat(0x3eab), 0.333984375f);
  EXPECT_EQ(FloatToBf16Bits(-2.5f), 0xc020);
}

TEST(Bf16HdTest, InfinityNanOverflowAndSignedZero) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToBf16Bits(inf), 0x7f80);
  EXPECT_EQ(FloatToBf16Bits(-inf), 0xff80);
  EXPECT_TRUE(std::isinf(Bf16BitsToFloat(0x7f80)));
  // The largest float rounds past the largest bf16 (0x7f7f): infinity.
  EXPECT_EQ(FloatToBf16Bits(std::numeric_limits<float>::max()), 0x7f80);
  // A NaN whose payload is only in the low bits must not turn into an infinity.
  for (uint32_t nan : {0x7f800001u, 0x7fc00000u, 0xff800001u, 0x7fffffffu}) {
    const uint16_t h = FloatToBf16Bits(F(nan));
    EXPECT_TRUE(std::isnan(Bf16BitsToFloat(h))) << std::hex << nan;
    EXPECT_EQ(h & 0x8000, (nan >> 16) & 0x8000) << "sign of " << std::hex << nan;
  }
  EXPECT_EQ(FloatToBf16Bits(0.0f), 0x0000);
  EXPECT_EQ(FloatToBf16Bits(-0.0f), 0x8000);
}

TEST(Bf16HdTest, SubnormalsRoundWithoutFlushing) {
  // The smallest fp32 subnormal (2^-149) is below half the smallest bf16 subnormal
  // (2^-133): rounds to zero. 2^-133 itself is exact.
  EXPECT_EQ(FloatToBf16Bits(F(0x00000001u)), 0x0000);
  EXPECT_EQ(FloatToBf16Bits(F(0x00010000u)), 0x0001);
  EXPECT_EQ(Bf16BitsToFloat(0x0001), std::ldexp(1.0f, -133));
  // Tie between bf16 subnormals 1 and 2: to even (2); just above 0.5 ulp rounds up.
  EXPECT_EQ(FloatToBf16Bits(F(0x00018000u)), 0x0002);
  EXPECT_EQ(FloatToBf16Bits(F(0x00008000u)), 0x0000);
  EXPECT_EQ(FloatToBf16Bits(F(0x00008001u)), 0x0001);
  // The largest subnormal rounds up to the smallest normal.
  EXPECT_EQ(FloatToBf16Bits(F(0x007fffffu)), 0x0080);
}

TEST(Bf16HdTest, EveryBf16RoundTripsExactly) {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const float f = Bf16BitsToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBf16Bits(f), h) << std::hex << h;
    // The fp32 of a bf16 is its bits followed by 16 zero bits.
    ASSERT_EQ(FloatToBits(f), h << 16) << std::hex << h;
  }
}

TEST(Bf16HdTest, MatchesAReferenceRoundingOnASweepOfFloats) {
  // Every 2^32 / 4093 ~ 1M-th bit pattern, plus, around every bf16 value, the patterns
  // on and next to the rounding tie, where an off-by-one rounding would show.
  int64_t checked = 0;
  for (uint64_t u = 0; u <= 0xffffffffu; u += 4093) {
    const float f = F(static_cast<uint32_t>(u));
    if (std::isnan(f) || std::isinf(f)) continue;
    ASSERT_EQ(FloatToBf16Bits(f), ReferenceBf16Bits(f)) << std::hex << u;
    ++checked;
  }
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    for (uint32_t low : {0x7fffu, 0x8000u, 0x8001u, 0xffffu, 0x0001u}) {
      const uint32_t u = (h << 16) | low;
      const float f = F(u);
      if (std::isnan(f) || std::isinf(f)) continue;
      ASSERT_EQ(FloatToBf16Bits(f), ReferenceBf16Bits(f)) << std::hex << u;
      ++checked;
    }
  }
  EXPECT_GT(checked, 1000000);
}

// A pair packs the first value's rounding in the low half (the lower address of a
// little-endian pair), each rounded as FloatToBf16Bits rounds it.
TEST(Bf16HdTest, PairBitsPackTheFirstValueLow) {
  EXPECT_EQ(Bf16PairBits(1.0f, -2.0f), 0xc0003f80u);
  const float third = 1.0f / 3.0f;
  EXPECT_EQ(Bf16PairBits(third, 0.0f), uint32_t{FloatToBf16Bits(third)});
  EXPECT_EQ(Bf16PairBits(0.0f, third), uint32_t{FloatToBf16Bits(third)} << 16);
}

}  // namespace
}  // namespace core
