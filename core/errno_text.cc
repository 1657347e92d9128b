#include "core/errno_text.h"

#include <string.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace core {
namespace {

// The two strerror_r flavours: GNU returns the message (maybe not `buf`), XSI an int.
[[maybe_unused]] const char* Message(char* result, const char* /*buf*/) { return result; }
[[maybe_unused]] const char* Message(int result, const char* buf) {
  return result == 0 ? buf : nullptr;
}

}  // namespace

std::string ErrnoText(int err) {
  char buf[256] = {};
  const char* text = Message(strerror_r(err, buf, sizeof(buf)), buf);
  if (text == nullptr || *text == '\0') return absl::StrCat("Unknown error ", err);
  return text;
}

}  // namespace core
