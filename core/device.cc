#include "core/device.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace core {

std::string Device::ToString() const {
  return is_cpu() ? std::string("cpu") : absl::StrCat("cuda:", index);
}

absl::StatusOr<Device> ParseDevice(absl::string_view text) {
  if (text == "cpu") return Device::Cpu();
  if (text == "cuda") return Device::Cuda(0);
  if (absl::ConsumePrefix(&text, "cuda:")) {
    int index = 0;
    if (absl::SimpleAtoi(text, &index) && index >= 0) return Device::Cuda(index);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("bad device '", text, "'; expected cpu, cuda or cuda:<index>"));
}

}  // namespace core
