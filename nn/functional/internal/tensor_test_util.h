// Test-only: the checks the tensor ops' tests (elementwise, shape, reduce) share.
//
//   ExpectGradients([](const std::vector<core::Tensor>& in) { ... }, {RandomTensor({2, 3}, 1)});
//   ExpectInvalid(F::Transpose(x, 3, 0).status(), "Transpose", "dim0 3");
#ifndef NN_FUNCTIONAL_INTERNAL_TENSOR_TEST_UTIL_H_
#define NN_FUNCTIONAL_INTERNAL_TENSOR_TEST_UTIL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/functional/gradcheck.h"

namespace nn {
namespace functional {
namespace tensor_test_util {

// Expects the gradient check of `fn` at `inputs` to pass, with gradients that are not all
// about 0.
inline void ExpectGradients(const gradcheck::Function& fn,
                            const std::vector<core::Tensor>& inputs) {
  absl::StatusOr<gradcheck::Report> r = gradcheck::CheckGradients(fn, inputs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok() && r->max_abs_numeric > 0.1) << r->ToString();
}

// Expects InvalidArgument whose message names `op` and contains `what`.
inline void ExpectInvalid(const absl::Status& s, const char* op, const char* what) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), ::testing::HasSubstr(op));
  EXPECT_THAT(s.message(), ::testing::HasSubstr(what));
}

// An int32 CPU tensor.
inline core::Tensor Ints(const std::vector<int32_t>& v, const core::Shape& shape) {
  return core::Tensor::FromInts(v, shape).value();
}

}  // namespace tensor_test_util
}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_INTERNAL_TENSOR_TEST_UTIL_H_
