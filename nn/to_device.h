// Moving a module's parameters between devices (and dtypes), keeping the Parameter
// objects: whoever holds a ParameterPtr (an optimizer, FSDP's registry, a tied layer)
// sees the moved tensors.
//
//   ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> gpt, nn::Gpt::Create(config));
//   RETURN_IF_ERROR(nn::ToDevice(*gpt, core::Device::Cuda(0)));
//   ASSIGN_OR_RETURN(core::Tensor logits, gpt->Forward(tokens));   // tokens on CPU or cuda:0
#ifndef NN_TO_DEVICE_H_
#define NN_TO_DEVICE_H_

#include "absl/status/status.h"
#include "core/device.h"
#include "core/module.h"
#include "core/tensor.h"

namespace nn {

// Replaces each parameter's `data` (and `grad`, when defined) of `module` and its
// descendants with a copy on `device` (same shape, dtype and memory tag; tied parameters
// moved once), leaving the Parameter objects in place. Parameters already there are left
// alone. All copies are made before any parameter is changed, so on error (an allocation
// or copy failing, named with the parameter's dotted path) nothing has moved.
absl::Status ToDevice(core::Module& module, const core::Device& device);

// Like ToDevice but converts every parameter's `data` to `dtype` (fp32 or bf16) on its
// current device, e.g. to run a model with bf16 weights; gradients are dropped (the
// layers allocate fp32 gradients on first use). Conversion runs on the host: device
// tensors are copied back and forth.
absl::Status ConvertParameters(core::Module& module, core::DType dtype);

}  // namespace nn

#endif  // NN_TO_DEVICE_H_
