// Private to nn/: the argument checks and CUDA plumbing shared by the tensor ops
// (nn/tensor_ops*.cc, nn/matmul.cc). Messages start with the caller's `what`.
//
//   RETURN_IF_ERROR(internal::CheckDevices(what, {{"input", &x}, {"output", &y}}));
//   if (x.device().is_cuda()) NN_ON_CUDA(x.device(), what, "GELU", cuda::GeluForward(...));
#ifndef NN_INTERNAL_OP_CHECKS_H_
#define NN_INTERNAL_OP_CHECKS_H_

#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/status_macros.h"
#include "core/tensor.h"

#ifdef FSDP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "nn/cuda/status.h"
#endif

namespace nn {
namespace internal {

using core::DType;
using core::Tensor;

struct Arg {
  const char* name;
  const Tensor* tensor;
};

inline std::string Describe(const Tensor& t) {
  return t.defined() ? t.ToString() : std::string("undefined");
}

// OK when every tensor in `args` is defined and on the device of the first.
inline absl::Status CheckDevices(absl::string_view what, std::initializer_list<Arg> args) {
  const Arg* first = nullptr;
  for (const Arg& a : args) {
    if (!a.tensor->defined()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", a.name, " is undefined"));
    }
    if (first == nullptr) {
      first = &a;
    } else if (a.tensor->device() != first->tensor->device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": ", a.name, " ", a.tensor->ToString(), " is on ", a.tensor->device().ToString(),
          " but ", first->name, " ", first->tensor->ToString(), " is on ",
          first->tensor->device().ToString(), "; all operands must share a device"));
    }
  }
  return absl::OkStatus();
}

inline absl::Status CheckDType(absl::string_view what, const char* name, const Tensor& t,
                               DType dtype) {
  if (t.dtype() != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", name, " must be ", core::DTypeName(dtype), ", got ", Describe(t)));
  }
  return absl::OkStatus();
}

// InvalidArgument naming `name` unless `t` is fp32 or bf16: a weight, or an output that a
// bf16 GEMM takes and that may be stored so (NOTE [GEMM epilogues]).
inline absl::Status CheckFp32OrBf16(absl::string_view what, const char* name, const Tensor& t) {
  if (t.dtype() != DType::kFloat32 && t.dtype() != DType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", name, " must be float32 or bfloat16, got ", Describe(t)));
  }
  return absl::OkStatus();
}

inline absl::Status CheckNumel(absl::string_view what, const char* name, const Tensor& t,
                               int64_t numel) {
  if (t.numel() != numel) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", name, " must have ", numel, " elements, got ", Describe(t)));
  }
  return absl::OkStatus();
}

// The checks of an elementwise op: every tensor in `args` defined and on one device
// (CheckDevices), float32, and with as many elements as the first.
inline absl::Status CheckElementwiseF32(absl::string_view what, std::initializer_list<Arg> args) {
  RETURN_IF_ERROR(CheckDevices(what, args));
  for (const Arg& a : args) {
    RETURN_IF_ERROR(CheckDType(what, a.name, *a.tensor, DType::kFloat32));
  }
  const int64_t numel = args.begin()->tensor->numel();
  for (const Arg& a : args) {
    RETURN_IF_ERROR(CheckNumel(what, a.name, *a.tensor, numel));
  }
  return absl::OkStatus();
}

inline bool IsBf16(const Tensor& t) { return t.dtype() == DType::kBFloat16; }

// InvalidArgument unless `a` and `b` (both defined) start at different addresses, also
// when they are one Tensor object. The fused ops' callers pass whole tensors, so distinct
// starts mean no overlap.
inline absl::Status CheckDistinct(absl::string_view what, const char* a_name, const Tensor& a,
                                  const char* b_name, const Tensor& b) {
  if (a.raw_data() == b.raw_data() && a.numel() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", a_name, " and ", b_name, " must be different tensors"));
  }
  return absl::OkStatus();
}

#ifdef FSDP_WITH_CUDA
inline absl::Status UseDevice(const core::Device& d, absl::string_view what) {
  return ::nn::cuda::StatusFromCuda(cudaSetDevice(d.index),
                                    absl::StrCat(what, ": cudaSetDevice(", d.index, ")"));
}
inline absl::Status Launched(cudaError_t err, absl::string_view what, absl::string_view op) {
  return ::nn::cuda::StatusFromCuda(err, absl::StrCat(what, ": CUDA ", op));
}
// Runs a CUDA launcher returning cudaError_t on `device` and returns its status (from
// the enclosing function); without CUDA, returns FailedPrecondition.
#define NN_ON_CUDA(device, what, op, call)                    \
  do {                                                        \
    RETURN_IF_ERROR(::nn::internal::UseDevice(device, what)); \
    return ::nn::internal::Launched((call), what, op);        \
  } while (0)
#else
inline absl::Status NoCuda(const core::Device& d, absl::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": tensors are on ", d.ToString(),
                   " but this build has no CUDA support; build with "
                   "--config=cuda"));
}
#define NN_ON_CUDA(device, what, op, call) return ::nn::internal::NoCuda(device, what)
#endif

inline const float* F32(const Tensor& t) { return static_cast<const float*>(t.raw_data()); }
inline float* MutF32(const Tensor& t) { return static_cast<float*>(t.raw_data()); }

}  // namespace internal
}  // namespace nn

#endif  // NN_INTERNAL_OP_CHECKS_H_
