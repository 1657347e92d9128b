// Flag checks the benchmark binaries share: a bound on an integer flag, named in the
// message as the user typed it.
//
//   RETURN_IF_ERROR(bench::FlagsAtLeast("attention_bench", {{"reps", o.reps, 1},
//                                                           {"warmup", o.warmup, 0}}));
#ifndef BENCH_FLAG_CHECKS_H_
#define BENCH_FLAG_CHECKS_H_

#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace bench {

struct FlagBound {
  const char* name;  // without the dashes
  int64_t value;
  int64_t min;
};

// InvalidArgument "<program>: --<name>=<value> must be >= <min>" for the first flag below
// its bound, or OK.
inline absl::Status FlagsAtLeast(absl::string_view program,
                                 std::initializer_list<FlagBound> bounds) {
  for (const FlagBound& b : bounds) {
    if (b.value < b.min) {
      return absl::InvalidArgumentError(
          absl::StrCat(program, ": --", b.name, "=", b.value, " must be >= ", b.min));
    }
  }
  return absl::OkStatus();
}

}  // namespace bench

#endif  // BENCH_FLAG_CHECKS_H_
