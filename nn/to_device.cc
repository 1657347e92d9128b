#include "nn/to_device.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace nn {
namespace {

// A copy of `t` on `device` with the same tag.
absl::StatusOr<core::Tensor> CopyTo(const core::Tensor& t, const core::Device& device,
                                    const std::string& what) {
  const core::MemoryTag tag = t.storage() ? t.storage()->tag() : core::MemoryTag::kParam;
  absl::StatusOr<core::Tensor> out = core::Tensor::Allocate(t.shape(), t.dtype(), tag, device);
  if (!out.ok()) return core::Annotate(out.status(), what);
  RETURN_IF_ERROR(core::Annotate(out->CopyFrom(t), what));
  return out;
}

}  // namespace

absl::Status ToDevice(core::Module& module, const core::Device& device) {
  struct Move {
    core::ParameterPtr p;
    core::Tensor data, grad;
  };
  std::vector<Move> moves;
  for (const auto& [name, p] : module.NamedParameters()) {
    Move m{p, p->data, p->grad};
    const std::string what =
        absl::StrCat("ToDevice(", device.ToString(), "): parameter '", name, "'");
    if (p->data.is_meta()) {
      // Deferred (NOTE [Deferred initialisation]): it will be materialized there.
      m.data = core::Tensor::Meta(p->data.shape(), p->data.dtype(), device);
    } else if (p->data.defined() && p->data.device() != device) {
      ASSIGN_OR_RETURN(m.data, CopyTo(p->data, device, what));
    }
    if (p->grad.defined() && p->grad.device() != device) {
      ASSIGN_OR_RETURN(m.grad, CopyTo(p->grad, device, absl::StrCat(what, " gradient")));
    }
    moves.push_back(std::move(m));
  }
  for (Move& m : moves) {
    m.p->data = std::move(m.data);
    m.p->grad = std::move(m.grad);
  }
  return absl::OkStatus();
}

absl::Status ConvertParameters(core::Module& module, core::DType dtype) {
  if (dtype != core::DType::kFloat32 && dtype != core::DType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat("ConvertParameters: dtype must be float32 or "
                     "bfloat16, got ",
                     core::DTypeName(dtype)));
  }
  struct Change {
    core::ParameterPtr p;
    core::Tensor data;
  };
  std::vector<Change> changes;
  for (const auto& [name, p] : module.NamedParameters()) {
    if (!p->data.defined() || p->data.dtype() == dtype) continue;
    const std::string what =
        absl::StrCat("ConvertParameters(", core::DTypeName(dtype), "): parameter '", name, "'");
    const core::Device device = p->data.device();
    const core::MemoryTag tag = p->data.storage()->tag();
    ASSIGN_OR_RETURN(core::Tensor host, CopyTo(p->data, core::Device::Cpu(), what));
    absl::StatusOr<core::Tensor> converted = host.ToDType(dtype, tag);
    if (!converted.ok()) return core::Annotate(converted.status(), what);
    core::Tensor data = *std::move(converted);
    if (!device.is_cpu()) {
      ASSIGN_OR_RETURN(data, CopyTo(data, device, what));
    }
    changes.push_back({p, std::move(data)});
  }
  for (Change& c : changes) {
    c.p->data = std::move(c.data);
    c.p->grad = core::Tensor();
  }
  return absl::OkStatus();
}

}  // namespace nn
