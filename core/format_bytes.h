// Human-readable byte counts for messages and reports.
//
//   core::FormatBytes(3 << 20);   // "3.00MiB"
#ifndef CORE_FORMAT_BYTES_H_
#define CORE_FORMAT_BYTES_H_

#include <cstdint>
#include <string>

namespace core {

// Formats a byte count as "512B", "1.50KiB", "3.25MiB", "1.00GiB", "256.00TiB" (TiB
// above that); negative counts as "-" and the magnitude.
std::string FormatBytes(int64_t bytes);

}  // namespace core

#endif  // CORE_FORMAT_BYTES_H_
