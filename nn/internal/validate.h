// Private to nn/: argument checks shared by the layers. Each returns InvalidArgument
// (or FailedPrecondition for call-order mistakes) whose message starts with the
// module's Describe(), e.g. "blocks.0.attn.qkv (Linear): input must have last
// dimension 32, got [4, 16]".
#ifndef NN_INTERNAL_VALIDATE_H_
#define NN_INTERNAL_VALIDATE_H_

#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/module.h"
#include "core/tensor.h"

namespace nn {
namespace internal {

// InvalidArgument "<Describe()>: <message>".
inline absl::Status ModuleError(const core::Module& m, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(m.Describe(), ": ", message));
}

// OK if `t` is a defined CPU tensor of `dtype`; `what` names it ("input", "grad_output").
inline absl::Status CheckTensor(const core::Module& m, const core::Tensor& t, core::DType dtype,
                                absl::string_view what) {
  if (!t.defined()) return ModuleError(m, absl::StrCat(what, " is undefined"));
  if (!t.device().is_cpu()) {
    return ModuleError(m, absl::StrCat(what, " ", t.ToString(),
                                       " is not on the CPU; nn layers compute on the CPU"));
  }
  if (t.dtype() != dtype) {
    return ModuleError(
        m, absl::StrCat(what, " must be ", core::DTypeName(dtype), ", got ", t.ToString()));
  }
  return absl::OkStatus();
}

// CheckTensor plus: at least one dimension and last dimension == `last`.
inline absl::Status CheckLastDim(const core::Module& m, const core::Tensor& t, int64_t last,
                                 absl::string_view what) {
  absl::Status s = CheckTensor(m, t, core::DType::kFloat32, what);
  if (!s.ok()) return s;
  if (t.dim() == 0 || t.size(-1) != last) {
    return ModuleError(m, absl::StrCat(what, " must have last dimension ", last, ", got ",
                                       core::ShapeToString(t.shape())));
  }
  return absl::OkStatus();
}

// OK if `grad_output` is fp32 on the CPU with the shape of the output of the cached
// forward; FailedPrecondition if there is no cached forward (`have_cache` false).
inline absl::Status CheckGradOutput(const core::Module& m, bool have_cache,
                                    const core::Shape& output_shape,
                                    const core::Tensor& grad_output) {
  if (!have_cache) {
    return absl::FailedPreconditionError(
        absl::StrCat(m.Describe(), ": Backward called without a preceding Forward"));
  }
  absl::Status s = CheckTensor(m, grad_output, core::DType::kFloat32, "grad_output");
  if (!s.ok()) return s;
  if (grad_output.shape() != output_shape) {
    return ModuleError(
        m, absl::StrCat("grad_output shape ", core::ShapeToString(grad_output.shape()),
                        " differs from the forward output's ", core::ShapeToString(output_shape)));
  }
  return absl::OkStatus();
}

// A constructor argument check kept for the first Forward: empty when valid.
inline std::string PositiveOrMessage(absl::string_view name, int64_t value) {
  return value > 0 ? std::string() : absl::StrCat(name, " must be positive, got ", value);
}

// The first non-empty message, so several constructor checks can be chained.
inline std::string FirstError(std::initializer_list<std::string> messages) {
  for (const std::string& m : messages) {
    if (!m.empty()) return m;
  }
  return std::string();
}

// An uninitialised fp32 CPU tensor for activations or gradients (tag kActivation);
// ResourceExhausted when memory runs out.
inline absl::StatusOr<core::Tensor> NewActivation(const core::Shape& shape) {
  return core::Tensor::Allocate(shape, core::DType::kFloat32, core::MemoryTag::kActivation);
}

// OK if parameter `name` holds an fp32 CPU tensor of exactly `shape`. A parameter whose
// data is some other shape (say a 1-D shard left in place by FSDP) gives
// FailedPrecondition rather than a read out of bounds.
inline absl::Status CheckParameter(const core::Module& m, const core::Parameter& p,
                                   absl::string_view name, const core::Shape& shape) {
  if (!p.data.defined() || !p.data.device().is_cpu() || p.data.dtype() != core::DType::kFloat32 ||
      p.data.shape() != shape) {
    return absl::FailedPreconditionError(
        absl::StrCat(m.Describe(), ": parameter '", name,
                     "' must be a float32 CPU tensor of shape ", core::ShapeToString(shape),
                     ", got ", p.data.defined() ? p.data.ToString() : std::string("undefined"),
                     " (is it still sharded?)"));
  }
  return absl::OkStatus();
}

// The fp32 gradient buffer of `p` to add into (allocated as zeros on first use), or
// nullptr when p.requires_grad is false.
inline absl::StatusOr<float*> GradBuffer(const core::Module& m, core::Parameter& p,
                                         absl::string_view name) {
  if (!p.requires_grad) return static_cast<float*>(nullptr);
  absl::Status s = p.EnsureGrad();
  if (!s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(m.Describe(), ": parameter '", name, "': ", s.message()));
  }
  if (!p.grad.device().is_cpu() || p.grad.dtype() != core::DType::kFloat32) {
    return absl::FailedPreconditionError(
        absl::StrCat(m.Describe(), ": parameter '", name,
                     "' gradient must be a float32 CPU tensor, got ", p.grad.ToString()));
  }
  return p.grad.data<float>();
}

}  // namespace internal
}  // namespace nn

#endif  // NN_INTERNAL_VALIDATE_H_
