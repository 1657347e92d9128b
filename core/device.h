// Where a tensor's memory lives: the host CPU or CUDA device i.
//
//   core::Device d = core::Device::Cuda(0);
//   d.ToString();  // "cuda:0"
#ifndef CORE_DEVICE_H_
#define CORE_DEVICE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace core {

struct Device {
  enum class Type { kCpu, kCuda };

  Type type = Type::kCpu;
  int index = 0;

  static Device Cpu() { return Device{Type::kCpu, 0}; }
  static Device Cuda(int index) { return Device{Type::kCuda, index}; }

  bool is_cpu() const { return type == Type::kCpu; }
  bool is_cuda() const { return type == Type::kCuda; }

  // "cpu" or "cuda:<index>".
  std::string ToString() const;

  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// Parses "cpu", "cuda" (device 0) or "cuda:<index>"; InvalidArgument otherwise.
absl::StatusOr<Device> ParseDevice(absl::string_view text);

}  // namespace core

#endif  // CORE_DEVICE_H_
