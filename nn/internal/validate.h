// Private to nn/: argument checks shared by the layers (any device; see NOTE [Device
// dispatch] in nn/tensor_ops.h). Each returns InvalidArgument
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
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/module.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "nn/tensor_ops.h"

namespace nn {
namespace internal {

// InvalidArgument "<Describe()>: <message>".
inline absl::Status ModuleError(const core::Module& m, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(m.Describe(), ": ", message));
}

// OK if `t` is a defined tensor of `dtype` (on any device); `what` names it ("input",
// "grad_output").
inline absl::Status CheckTensor(const core::Module& m, const core::Tensor& t, core::DType dtype,
                                absl::string_view what) {
  if (!t.defined()) return ModuleError(m, absl::StrCat(what, " is undefined"));
  if (t.dtype() != dtype) {
    return ModuleError(
        m, absl::StrCat(what, " must be ", core::DTypeName(dtype), ", got ", t.ToString()));
  }
  return absl::OkStatus();
}

// InvalidArgument naming both devices unless `t` is on `device` (the device of the
// tensor named `other`, usually the input).
inline absl::Status CheckDevice(const core::Module& m, const core::Tensor& t,
                                absl::string_view what, const core::Device& device,
                                absl::string_view other) {
  if (t.device() == device) return absl::OkStatus();
  return ModuleError(m, absl::StrCat(what, " ", t.ToString(), " is on ", t.device().ToString(),
                                     " but ", other, " is on ", device.ToString(),
                                     "; move the module and its inputs to one device"));
}

// CheckTensor plus: at least one dimension and last dimension == `last`.
inline absl::Status CheckLastDim(const core::Module& m, const core::Tensor& t, int64_t last,
                                 absl::string_view what,
                                 core::DType dtype = core::DType::kFloat32) {
  RETURN_IF_ERROR(CheckTensor(m, t, dtype, what));
  if (t.dim() == 0 || t.size(-1) != last) {
    return ModuleError(m, absl::StrCat(what, " must have last dimension ", last, ", got ",
                                       core::ShapeToString(t.shape())));
  }
  return absl::OkStatus();
}

// OK when `x` is a sequence [B, T, width] (its dtype is the ops' to check), else
// InvalidArgument naming `m`: the input of the attentions.
inline absl::Status CheckSequence(const core::Module& m, const core::Tensor& x, int64_t width) {
  if (x.defined() && x.dim() == 3 && x.size(2) == width) return absl::OkStatus();
  return ModuleError(m, absl::StrCat("input must be [B, T, ", width, "], got ",
                                     x.defined() ? core::ShapeToString(x.shape()) : "undefined"));
}

// OK if `grad_output` is fp32 with the shape of the output of the cached
// forward; FailedPrecondition if there is no cached forward (`have_cache` false).
// `bf16_ok`: the module also takes a bf16 grad_output (Linear::GradOutputDType).
inline absl::Status CheckGradOutput(const core::Module& m, bool have_cache,
                                    const core::Shape& output_shape,
                                    const core::Tensor& grad_output, bool bf16_ok = false) {
  if (!have_cache) {
    return absl::FailedPreconditionError(
        absl::StrCat(m.Describe(), ": Backward called without a preceding Forward"));
  }
  const bool bf16 =
      bf16_ok && grad_output.defined() && grad_output.dtype() == core::DType::kBFloat16;
  RETURN_IF_ERROR(CheckTensor(m, grad_output, bf16 ? core::DType::kBFloat16 : core::DType::kFloat32,
                              "grad_output"));
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

// A bf16 copy of the fp32 activation `t` (tag kActivation), the operand of a bf16 GEMM
// (NOTE [bf16 GEMMs] in nn/linear.h), or `t` itself when its producer already stored it
// bf16 (NOTE [GEMM epilogues] in nn/tensor_ops.h); an error names `m` and `name`.
inline absl::StatusOr<core::Tensor> RoundToBf16(const core::Module& m, const core::Tensor& t,
                                                absl::string_view name) {
  if (t.defined() && t.dtype() == core::DType::kBFloat16) return t;
  absl::StatusOr<core::Tensor> rounded =
      t.ToDType(core::DType::kBFloat16, core::MemoryTag::kActivation);
  if (!rounded.ok()) {
    return ModuleError(m,
                       absl::StrCat("rounding ", name, " to bf16: ", rounded.status().message()));
  }
  return rounded;
}

// An uninitialised tensor (fp32 unless `dtype` says otherwise) on `device` for
// activations or gradients (tag kActivation); ResourceExhausted when memory runs out.
inline absl::StatusOr<core::Tensor> NewActivation(const core::Shape& shape,
                                                  const core::Device& device = core::Device::Cpu(),
                                                  core::DType dtype = core::DType::kFloat32) {
  return core::Tensor::Allocate(shape, dtype, core::MemoryTag::kActivation, device);
}

// OK if parameter `name` holds an fp32 or bf16 tensor of exactly `shape` on `device` (the
// input's). A deferred parameter (not materialized) is FailedPrecondition naming it. A parameter
// whose data is some other shape (say a 1-D shard left in place by FSDP) gives FailedPrecondition
// rather than a read out of bounds; one on another device gives InvalidArgument naming both
// devices.
inline absl::Status CheckParameter(const core::Module& m, const core::Parameter& p,
                                   absl::string_view name, const core::Shape& shape,
                                   const core::Device& device = core::Device::Cpu()) {
  if (p.deferred()) {
    return absl::FailedPreconditionError(absl::StrCat(
        m.Describe(), ": parameter '", name, "' ", p.data.ToString(),
        " is deferred and not materialized yet (NOTE [Deferred initialisation] in "
        "core/param_init.h): wrap the model with fsdp::FullyShard, which allocates and "
        "initialises each rank's shard, before running it"));
  }
  if (!p.data.defined() ||
      (p.data.dtype() != core::DType::kFloat32 && p.data.dtype() != core::DType::kBFloat16) ||
      p.data.shape() != shape) {
    return absl::FailedPreconditionError(
        absl::StrCat(m.Describe(), ": parameter '", name,
                     "' must be a float32 or bfloat16 tensor of shape ", core::ShapeToString(shape),
                     ", got ", p.data.defined() ? p.data.ToString() : std::string("undefined"),
                     " (is it still sharded?)"));
  }
  if (p.data.device() != device) {
    return ModuleError(
        m, absl::StrCat("parameter '", name, "' ", p.data.ToString(), " is on ",
                        p.data.device().ToString(), " but the input is on ", device.ToString(),
                        "; move the module (nn::ToDevice) or the input"));
  }
  return absl::OkStatus();
}

// The fp32 gradient of `p` to add into, on its data's device, with the shape of `p.data`
// (allocated as zeros on first use; fp32 even when the data is bf16). FailedPrecondition when
// an existing grad is not fp32 or has another numel; InvalidArgument when it is on another
// device than the data. Messages start with `prefix` ("<module>: parameter 'weight'").
inline absl::StatusOr<core::Tensor> ParameterGradIn(const std::string& prefix, core::Parameter& p) {
  if (!p.grad.defined()) {
    absl::StatusOr<core::Tensor> g = core::Tensor::Allocate(
        p.data.shape(), core::DType::kFloat32, core::MemoryTag::kGrad, p.data.device());
    if (!g.ok()) return core::Annotate(g.status(), prefix);
    RETURN_IF_ERROR(ZeroTensor(prefix, *g));
    p.grad = *std::move(g);
  }
  if (p.grad.dtype() != core::DType::kFloat32 || p.grad.numel() != p.data.numel()) {
    return absl::FailedPreconditionError(
        absl::StrCat(prefix, " gradient must be a float32 tensor of ", p.data.numel(),
                     " elements, got ", p.grad.ToString()));
  }
  if (p.grad.device() != p.data.device()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, " has data on ",
                                                   p.data.device().ToString(), " but grad on ",
                                                   p.grad.device().ToString()));
  }
  if (p.grad.shape() == p.data.shape()) return p.grad;
  return p.grad.Reshape(p.data.shape());
}

// ParameterGradIn for parameter `name` of module `m`, or an undefined tensor when
// p.requires_grad is false.
inline absl::StatusOr<core::Tensor> GradTensor(const core::Module& m, core::Parameter& p,
                                               absl::string_view name) {
  if (!p.requires_grad) return core::Tensor();
  return ParameterGradIn(absl::StrCat(m.Describe(), ": parameter '", name, "'"), p);
}

// Describe() of `m` for messages of the tensor ops (nn/tensor_ops.h).
inline std::string What(const core::Module& m) { return m.Describe(); }

// NOTE [Block forwards] (nn/transformer.h): whether a graph module's forward may compute `m`
// inline, passing m's parameters to fused functions (nn/functional/fused.h) instead of calling
// m.Call, because nothing could tell the difference: no module of m's subtree has hooks or is
// checkpointed, and each constructed cleanly. A child a policy wraps or checkpoints is called,
// so its hooks run.
inline bool RunsInline(const core::Module& m) {
  if (m.NumHooks() != 0 || !m.ConstructionStatus().ok() || m.checkpoint_activations()) {
    return false;
  }
  for (const auto& [name, child] : m.NamedChildren()) {
    if (!RunsInline(*child)) return false;
  }
  return true;
}

// OK, or CheckParameter's FailedPrecondition for the first deferred parameter of m's subtree:
// a forward that runs children inline checks this first, as each child would.
inline absl::Status CheckMaterialized(const core::Module& m) {
  for (const auto& [name, p] : m.OwnParameters()) {
    if (p->deferred()) return CheckParameter(m, *p, name, p->data.shape());
  }
  for (const auto& [name, child] : m.NamedChildren()) {
    RETURN_IF_ERROR(CheckMaterialized(*child));
  }
  return absl::OkStatus();
}

// InvalidArgument naming `m` unless a graph module's forward got `n` inputs.
inline absl::Status CheckInputCount(const core::Module& m, const core::Tensors& inputs, size_t n) {
  if (inputs.size() == n) return absl::OkStatus();
  return ModuleError(
      m, absl::StrCat("takes ", n, " input", n == 1 ? "" : "s", ", got ", inputs.size()));
}

// `result`, its error prefixed with m.Describe() unless it already names `m` or a descendant
// (a message starting with m's path), so an op's failure inside m's forward says where it was.
template <typename T>
absl::StatusOr<T> InModule(const core::Module& m, absl::StatusOr<T> result) {
  if (result.ok()) return result;
  const std::string path = m.Path();
  const absl::Status& s = result.status();
  if (absl::StartsWith(s.message(), m.Describe()) ||
      (!path.empty() && absl::StartsWith(s.message(), path))) {
    return result;
  }
  return core::Annotate(s, m.Describe());
}

// The input gradients a norm layer's backward (LayerNorm, RmsNorm: module `m`, the input
// it kept, its weight of `dim`) writes, after the checks both make: grad_output fits the
// kept input (a Forward ran) on its device, the weight is there, and a defined residual
// (BackwardAdd) is fp32 of grad_output's shape there too. gx is fp32 of the input's shape;
// gx16, its bf16 copy, only when `want16`.
struct NormInputGrads {
  core::Tensor gx, gx16;
};
inline absl::StatusOr<NormInputGrads> NewNormInputGrads(const core::Module& m,
                                                        const core::Tensor& input,
                                                        const core::Parameter& weight, int64_t dim,
                                                        const core::Tensor& g,
                                                        const core::Tensor& residual, bool want16) {
  RETURN_IF_ERROR(CheckGradOutput(m, input.defined(), input.shape(), g));
  const core::Device device = input.device();
  RETURN_IF_ERROR(CheckDevice(m, g, "grad_output", device, "the input"));
  RETURN_IF_ERROR(CheckParameter(m, weight, "weight", {dim}, device));
  if (residual.defined()) {
    if (residual.shape() != g.shape() || residual.dtype() != core::DType::kFloat32) {
      return ModuleError(m, absl::StrCat("residual ", residual.ToString(),
                                         " must be fp32 like grad_output ", g.ToString()));
    }
    RETURN_IF_ERROR(CheckDevice(m, residual, "residual", device, "the input"));
  }
  NormInputGrads out;
  ASSIGN_OR_RETURN(out.gx, NewActivation(input.shape(), device));
  if (want16) {
    ASSIGN_OR_RETURN(out.gx16, NewActivation(input.shape(), device, core::DType::kBFloat16));
  }
  return out;
}

}  // namespace internal
}  // namespace nn

#endif  // NN_INTERNAL_VALIDATE_H_
