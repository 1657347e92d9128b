#include "checkpoint/crc32c.h"

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace checkpoint {
namespace {

// Bit-at-a-time CRC32C straight from the definition, to check the table-driven one.
uint32_t ReferenceCrc32c(const unsigned char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? 0x82F63B78u : 0u);
  }
  return ~c;
}

// The published check value of CRC-32C ("123456789") and the iSCSI test vectors of
// RFC 3720 section B.4.
TEST(Crc32cTest, MatchesPublishedVectors) {
  const std::string check = "123456789";
  EXPECT_EQ(Crc32c(check.data(), check.size()), 0xE3069283u);

  std::vector<unsigned char> buf(32, 0x00);
  EXPECT_EQ(Crc32c(buf.data(), buf.size()), 0x8A9136AAu);
  std::fill(buf.begin(), buf.end(), 0xFF);
  EXPECT_EQ(Crc32c(buf.data(), buf.size()), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(Crc32c(buf.data(), buf.size()), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(31 - i);
  EXPECT_EQ(Crc32c(buf.data(), buf.size()), 0x113FDB5Cu);
}

TEST(Crc32cTest, EmptyInputIsZero) {
  EXPECT_EQ(Crc32c(nullptr, 0), 0u);
  EXPECT_EQ(ExtendCrc32c(0x12345678u, nullptr, 0), 0x12345678u);
}

// Every length 0..300 at every start alignment 0..7 agrees with the bit-wise reference,
// so both the 8-byte loop and the byte tail are right.
TEST(Crc32cTest, AgreesWithBitwiseReferenceAtAllLengthsAndAlignments) {
  std::mt19937 rng(7);
  std::vector<unsigned char> buf(400);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n = 0; n <= 300; ++n) {
      ASSERT_EQ(Crc32c(buf.data() + offset, n), ReferenceCrc32c(buf.data() + offset, n))
          << "offset " << offset << " length " << n;
    }
  }
}

// The table-driven loop (what runs without the CRC32 instruction) agrees too, and with the
// default path on long buffers; the test says which path the default took here.
TEST(Crc32cTest, ThePortableLoopAgreesWithTheReferenceAndTheDefaultPath) {
  std::mt19937 rng(5);
  std::vector<unsigned char> buf(1 << 16);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n = 0; n <= 300; ++n) {
      ASSERT_EQ(ExtendCrc32cPortable(0, buf.data() + offset, n),
                ReferenceCrc32c(buf.data() + offset, n))
          << "offset " << offset << " length " << n;
    }
  }
  EXPECT_EQ(ExtendCrc32cPortable(0x9u, buf.data() + 3, buf.size() - 3),
            ExtendCrc32c(0x9u, buf.data() + 3, buf.size() - 3));
  std::printf("ExtendCrc32c runs on %s\n",
              Crc32cUsesHardware() ? "the SSE4.2 CRC32 instruction" : "the table-driven loop");
}

TEST(Crc32cTest, ExtendEqualsOneShotAtEverySplit) {
  std::mt19937 rng(11);
  std::vector<unsigned char> buf(257);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  const uint32_t whole = Crc32c(buf.data(), buf.size());
  for (size_t k = 0; k <= buf.size(); ++k) {
    ASSERT_EQ(ExtendCrc32c(Crc32c(buf.data(), k), buf.data() + k, buf.size() - k), whole)
        << "split at " << k;
  }
}

TEST(Crc32cTest, DetectsEverySingleBitFlip) {
  std::vector<unsigned char> buf(64);
  for (int i = 0; i < 64; ++i) buf[i] = static_cast<unsigned char>(i * 37 + 1);
  const uint32_t original = Crc32c(buf.data(), buf.size());
  for (size_t i = 0; i < buf.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      buf[i] ^= static_cast<unsigned char>(1u << bit);
      ASSERT_NE(Crc32c(buf.data(), buf.size()), original) << "byte " << i << " bit " << bit;
      buf[i] ^= static_cast<unsigned char>(1u << bit);
    }
  }
}

}  // namespace
}  // namespace checkpoint
