#include "checkpoint/crc32c.h"

#include <array>
#include <cstring>

namespace checkpoint {
namespace {

// Reflected form of the Castagnoli polynomial 0x1EDC6F41.
constexpr uint32_t kPolynomial = 0x82F63B78u;

// tables[0] is the classic byte-at-a-time table; tables[k][b] is the CRC of byte b
// followed by k zero bytes, which lets the loop consume 8 bytes per step.
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1u) ? kPolynomial : 0u);
      t[0][b] = c;
    }
    for (int k = 1; k < 8; ++k) {
      for (uint32_t b = 0; b < 256; ++b) {
        t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
      }
    }
  }
};

const Tables& GetTables() {
  static const Tables* const tables = new Tables();
  return *tables;
}

}  // namespace

uint32_t ExtendCrc32cPortable(uint32_t crc, const void* data, size_t n) {
  const auto& t = GetTables().t;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (n >= 8) {
    // Little-endian assembly, independent of the host's byte order and alignment.
    const uint32_t lo = (static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24) ^
                        c;
    c = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^
        t[3][p[4]] ^ t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = (c >> 8) ^ t[0][(c ^ *p) & 0xFFu];
    ++p;
    --n;
  }
  return ~c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
namespace {

// The SSE4.2 CRC32 instruction computes CRC32C (the Castagnoli polynomial) on the reflected
// state directly: 8 bytes per instruction, then the tail byte by byte.
__attribute__((target("sse4.2"))) uint32_t ExtendCrc32cHardware(uint32_t crc, const void* data,
                                                                size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);  // x86 is little-endian; unaligned loads are fine
    c = __builtin_ia32_crc32di(c, word);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n > 0) {
    c32 = __builtin_ia32_crc32qi(c32, *p);
    ++p;
    --n;
  }
  return ~c32;
}

bool DetectHardware() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
}

}  // namespace

bool Crc32cUsesHardware() {
  static const bool has = DetectHardware();
  return has;
}

uint32_t ExtendCrc32c(uint32_t crc, const void* data, size_t n) {
  return Crc32cUsesHardware() ? ExtendCrc32cHardware(crc, data, n)
                              : ExtendCrc32cPortable(crc, data, n);
}
#else
bool Crc32cUsesHardware() { return false; }

uint32_t ExtendCrc32c(uint32_t crc, const void* data, size_t n) {
  return ExtendCrc32cPortable(crc, data, n);
}
#endif

uint32_t Crc32c(const void* data, size_t n) { return ExtendCrc32c(0, data, n); }

}  // namespace checkpoint
