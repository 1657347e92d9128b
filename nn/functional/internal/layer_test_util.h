// Test-only: what the layer-level ops' tests share (linear_test, norm_test, embedding_test,
// softmax_test, loss_test): random inputs, id tensors, bit-for-bit and error expectations.
//
//   layer_test_util::ExpectSameBits(*y, *want_y, "output");
//   layer_test_util::ExpectInvalid(Linear(x, w).status(), "Linear: input");
#ifndef NN_FUNCTIONAL_INTERNAL_LAYER_TEST_UTIL_H_
#define NN_FUNCTIONAL_INTERNAL_LAYER_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/functional/gradcheck.h"

namespace nn {
namespace functional {
namespace layer_test_util {

// An fp32 CPU tensor of N(0, stddev) draws from `seed`.
inline core::Tensor Random(const core::Shape& shape, uint64_t seed, float stddev = 1.0f) {
  return gradcheck::RandomTensor(shape, seed, stddev);
}

// An int32 CPU tensor holding `v`.
inline core::Tensor Ids(const std::vector<int32_t>& v, const core::Shape& shape) {
  return core::Tensor::FromInts(v, shape).value();
}

// `got` and `want` have one dtype, shape and device and the same bytes.
inline void ExpectSameBits(const core::Tensor& got, const core::Tensor& want,
                           const std::string& what) {
  ASSERT_TRUE(got.defined() && want.defined()) << what;
  ASSERT_EQ(got.ToString(), want.ToString()) << what;
  EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), got.nbytes()), 0) << what;
}

// `s` is InvalidArgument and its message contains `part`.
inline void ExpectInvalid(const absl::Status& s, const std::string& part) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(part));
}

}  // namespace layer_test_util
}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_INTERNAL_LAYER_TEST_UTIL_H_
