// Parameter: a trainable tensor and its gradient, shared by identity.
//
// Users, optimizers and the FSDP registry hold std::shared_ptr<Parameter>; whatever
// happens to the memory behind `data` (flattening, sharding, release), the object stays
// the same, so a pointer taken before wrapping is still the parameter after it.
//
//   core::ParameterPtr w = core::Parameter::Make(core::Tensor::Zeros({3, 4}));
//   RETURN_IF_ERROR(w->EnsureGrad());   // zeros shaped like data, tag kGrad
#ifndef CORE_PARAMETER_H_
#define CORE_PARAMETER_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/param_init.h"
#include "core/tensor.h"

namespace core {

struct Parameter {
  Tensor data;
  // Accumulated gradient, the same numel as `data`, or undefined before the first
  // backward. Layers add into it; ZeroGrad clears it.
  Tensor grad;
  bool requires_grad = true;
  // How its values were (or, deferred, will be) initialised (core/param_init.h); null
  // for parameters made from given values.
  std::shared_ptr<const ParamInit> init;
  // NOTE [Autograd] (core/autograd.h): the leaf record that every use of this parameter in
  // a differentiable op shares (core::Value makes it on first use); its node adds the
  // gradients that reach it into `grad`.
  std::shared_ptr<AutogradMeta> autograd;

  // True while `data` is a meta tensor: built under DeferredInitScope, not materialized
  // yet (NOTE [Deferred initialisation]).
  bool deferred() const { return data.is_meta(); }

  static std::shared_ptr<Parameter> Make(Tensor data, bool requires_grad = true) {
    auto p = std::make_shared<Parameter>();
    p->data = std::move(data);
    p->requires_grad = requires_grad;
    return p;
  }

  // Makes `grad` a zero tensor of data's shape (tag kGrad) if it is undefined.
  // FailedPrecondition if it exists with a different numel than `data`.
  absl::Status EnsureGrad() {
    if (!grad.defined()) {
      absl::StatusOr<Tensor> g =
          Tensor::Allocate(data.shape(), data.dtype(), MemoryTag::kGrad, data.device());
      if (!g.ok()) return g.status();
      grad = *std::move(g);
      grad.Zero();
      return absl::OkStatus();
    }
    if (grad.numel() != data.numel()) {
      return absl::FailedPreconditionError(
          absl::StrCat("gradient has ", grad.numel(), " elements ", ShapeToString(grad.shape()),
                       " but the parameter has ", data.numel(), " ", ShapeToString(data.shape())));
    }
    return absl::OkStatus();
  }
};

using ParameterPtr = std::shared_ptr<Parameter>;

}  // namespace core

#endif  // CORE_PARAMETER_H_
