// Fuzz target: untrusted bytes -> the safetensors reader (checkpoint::ParseSafetensors:
// the 8-byte header length, the JSON header, every entry's dtype, shape and offsets, the
// tiling of the byte buffer, then the tensors). It must never crash, abort, throw or
// read outside the input; what it accepts must agree with the input's size.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<checkpoint::SafetensorsFile> file = checkpoint::ParseSafetensors(bytes, "fuzz");
  if (!file.ok()) return 0;
  // Accepted: header length + header + every tensor's bytes is exactly the input.
  uint64_t header = 0;
  for (int i = 0; i < 8; ++i)
    header |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  uint64_t total = 8 + header;
  for (size_t i = 0; i < file->tensors.size(); ++i) {
    const core::Tensor& tensor = file->tensors[i].second;
    // An F16 tensor is read widened to F32: 2 bytes an element in the input.
    total += file->stored_dtypes[i] == "F16" ? 2 * static_cast<uint64_t>(tensor.numel())
                                             : static_cast<uint64_t>(tensor.nbytes());
  }
  if (total != size) std::abort();
  return 0;
}
