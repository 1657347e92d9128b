// CRC32C (Castagnoli polynomial, as in iSCSI, ext4 and LevelDB): the checksum a
// checkpoint keeps per block of each data file, so a reader verifies exactly the bytes
// it reads. On x86-64 CPUs with SSE4.2 it runs on the CRC32 instruction (chosen at run time,
// several times the speed of the table); elsewhere on a table-driven loop (slicing by 8).
//
//   uint32_t crc = checkpoint::Crc32c(data, n);
//   // The same value, computed in two pieces:
//   uint32_t c = checkpoint::ExtendCrc32c(checkpoint::Crc32c(data, k), data + k, n - k);
#ifndef CHECKPOINT_CRC32C_H_
#define CHECKPOINT_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace checkpoint {

// CRC32C of `n` bytes at `data` (the standard one: initial value and final xor
// 0xFFFFFFFF, reflected). Crc32c("123456789", 9) == 0xE3069283. `data` may be null
// when n == 0; the CRC of no bytes is 0.
uint32_t Crc32c(const void* data, size_t n);

// The CRC32C of A followed by the `n` bytes at `data`, given `crc` == Crc32c(A).
uint32_t ExtendCrc32c(uint32_t crc, const void* data, size_t n);

// Whether ExtendCrc32c runs on the CPU's CRC32 instruction on this machine.
bool Crc32cUsesHardware();

// ExtendCrc32c's table-driven loop, whatever the CPU (what it runs without the instruction).
uint32_t ExtendCrc32cPortable(uint32_t crc, const void* data, size_t n);

}  // namespace checkpoint

#endif  // CHECKPOINT_CRC32C_H_
