// Test-only: what the layer-level ops' tests share (linear_test, norm_test, embedding_test,
// softmax_test, loss_test, fused_test, llama_fused_test; Bf16 also the GPU tests): random and
// bf16 inputs, id tensors, bit-for-bit, near-a-reference, gradient-check and error expectations.
//
//   layer_test_util::ExpectSameBits(*y, *want_y, "output");
//   layer_test_util::ExpectNear(*y, LinearRef(x, w, b), 1e-5);
//   layer_test_util::ExpectInvalid(Linear(x, w).status(), "Linear: input");
#ifndef NN_FUNCTIONAL_INTERNAL_LAYER_TEST_UTIL_H_
#define NN_FUNCTIONAL_INTERNAL_LAYER_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

// A bf16 copy of `t`, each value rounded once.
inline core::Tensor Bf16(const core::Tensor& t) {
  return t.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value();
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

// `got` has want.size() elements, each within `tol` of its entry of `want`.
inline void ExpectNear(const core::Tensor& got, const std::vector<double>& want, double tol) {
  const std::vector<float> g = got.ToVector();
  ASSERT_EQ(g.size(), want.size());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], want[i], tol) << "element " << i;
}

// The gradient check of `fn` at `inputs` (named `names` in its report) passes, and some numeric
// gradient is over 0.1 in magnitude.
inline void ExpectGradientsPass(const gradcheck::Function& fn,
                                const std::vector<core::Tensor>& inputs,
                                const std::vector<std::string>& names) {
  absl::StatusOr<gradcheck::Report> r = gradcheck::CheckGradients(fn, inputs, {}, {}, names);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_GT(r->max_abs_numeric, 0.1);
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
