#include "core/format_bytes.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace core {

std::string FormatBytes(int64_t bytes) {
  if (bytes < 0) {
    // -(INT64_MIN) overflows; its magnitude is 2^63 bytes.
    if (bytes == INT64_MIN) return "-8388608.00TiB";
    return absl::StrCat("-", FormatBytes(-bytes));
  }
  const double b = static_cast<double>(bytes);
  if (bytes < 1024) return absl::StrCat(bytes, "B");
  if (bytes < (int64_t{1} << 20)) return absl::StrFormat("%.2fKiB", b / 1024);
  if (bytes < (int64_t{1} << 30)) return absl::StrFormat("%.2fMiB", b / (1 << 20));
  if (bytes < (int64_t{1} << 40)) return absl::StrFormat("%.2fGiB", b / (1 << 30));
  return absl::StrFormat("%.2fTiB", b / static_cast<double>(int64_t{1} << 40));
}

}  // namespace core
