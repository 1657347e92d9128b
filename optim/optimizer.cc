#include "optim/optimizer.h"

#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"

namespace optim {

using core::DType;
using core::MemoryTag;
using core::NamedParameter;
using core::ParameterPtr;
using core::Tensor;

Optimizer::Optimizer(std::vector<NamedParameter> params, double lr)
    : params_(std::move(params)), states_(params_.size()), lr_(lr) {}

std::vector<NamedParameter> Optimizer::NameByIndex(std::vector<ParameterPtr> params) {
  std::vector<NamedParameter> named;
  named.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    named.emplace_back(absl::StrCat("#", i), std::move(params[i]));
  }
  return named;
}

absl::Status Optimizer::ValidateParameters(const std::string& type_name,
                                           const std::vector<NamedParameter>& params) {
  std::map<const core::Parameter*, std::string> seen_params;
  std::set<std::string> seen_names;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    if (name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(type_name, ": parameter at index ", i, " has an empty name"));
    }
    if (p == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(type_name, ": parameter '", name, "' is null"));
    }
    if (!seen_names.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat(type_name, ": two parameters are named '",
                                                     name, "'; names key the optimizer state"));
    }
    auto [it, inserted] = seen_params.emplace(p.get(), name);
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat(type_name, ": parameter '", name, "' is the same object as '", it->second,
                       "'; list each parameter once (it would be stepped twice)"));
    }
  }
  return absl::OkStatus();
}

void Optimizer::ZeroGrad(bool set_to_none) {
  for (auto& [name, p] : params_) {
    if (!p->grad.defined()) continue;
    if (set_to_none) {
      p->grad = Tensor();
    } else {
      p->grad.Zero();
    }
  }
}

absl::StatusOr<std::vector<size_t>> Optimizer::BeginStep() {
  const std::string type = TypeName();
  if (!std::isfinite(lr_) || lr_ < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        type, ": lr is ", lr_, "; it must be a finite number >= 0 (options.lr or set_lr)"));
  }
  const std::vector<std::string> names = StateNames();
  std::vector<size_t> active;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& [name, p] = params_[i];
    if (!p->requires_grad || !p->grad.defined()) continue;
    const Tensor& data = p->data;
    const Tensor& grad = p->grad;
    if (!data.defined()) {
      return absl::FailedPreconditionError(
          absl::StrCat(type, ": parameter '", name, "' has a gradient but no data"));
    }
    if (data.device() != grad.device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          type, ": parameter '", name, "' has data on ", data.device().ToString(),
          " but its gradient on ", grad.device().ToString(), "; both must be on one device"));
    }
    if (data.dtype() != DType::kFloat32 || grad.dtype() != DType::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat(
          type, ": parameter '", name, "' has data ", core::DTypeName(data.dtype()), " and grad ",
          core::DTypeName(grad.dtype()), "; the optimizer steps float32 (master) parameters"));
    }
    if (grad.numel() != data.numel()) {
      return absl::FailedPreconditionError(absl::StrCat(
          type, ": parameter '", name, "' has a gradient of ", grad.numel(), " elements ",
          core::ShapeToString(grad.shape()), " but its data has ", data.numel(), " elements ",
          core::ShapeToString(data.shape()), "; the gradient must match the data it updates"));
    }
    const ParamState& st = states_[i];
    for (size_t s = 0; s < st.tensors.size(); ++s) {
      if (st.tensors[s].numel() == data.numel()) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          type, ": parameter '", name, "' now has ", data.numel(), " elements ",
          core::ShapeToString(data.shape()), " but its optimizer state '", names[s], "' has ",
          st.tensors[s].numel(),
          " elements, allocated at its first step: the optimizer was "
          "stepped before the model was sharded (or the parameter was otherwise resized). "
          "Build the optimizer after wrapping the model, or call ResetState() to start its "
          "state afresh"));
    }
    active.push_back(i);
  }

  // Allocate every new state before committing anything, so a failure changes nothing.
  std::vector<std::vector<Tensor>> fresh(active.size());
  for (size_t k = 0; k < active.size(); ++k) {
    const size_t i = active[k];
    if (states_[i].steps > 0) continue;
    const Tensor& data = params_[i].second->data;
    for (size_t s = 0; s < names.size(); ++s) {
      ASSIGN_OR_RETURN(Tensor t, Tensor::Allocate(data.shape(), DType::kFloat32, MemoryTag::kOptim,
                                                  data.device()));
      t.Zero();
      fresh[k].push_back(std::move(t));
    }
  }
  for (size_t k = 0; k < active.size(); ++k) {
    ParamState& st = states_[active[k]];
    if (st.steps == 0) st.tensors = std::move(fresh[k]);
    ++st.steps;
  }
  ++step_count_;
  return active;
}

std::vector<std::pair<std::string, Tensor>> Optimizer::StateTensors() const {
  const std::vector<std::string> names = StateNames();
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamState& st = states_[i];
    for (size_t s = 0; s < st.tensors.size() && s < names.size(); ++s) {
      out.emplace_back(absl::StrCat(params_[i].first, ".", names[s]), st.tensors[s]);
    }
  }
  return out;
}

OptimizerState Optimizer::State() const {
  OptimizerState state;
  state.step_count = step_count_;
  state.tensors = StateTensors();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (states_[i].steps > 0) state.param_steps.emplace_back(params_[i].first, states_[i].steps);
  }
  return state;
}

namespace {

// State tensor `key` of `type` from `src`: an fp32 tensor shaped and placed as the
// parameter's `data`, on which the optimizer state lives (`src` widened or brought over).
absl::StatusOr<Tensor> Fp32StateTensor(const std::string& type, const std::string& key,
                                       const Tensor& src, const Tensor& data) {
  ASSIGN_OR_RETURN(
      Tensor t, Tensor::Allocate(data.shape(), DType::kFloat32, MemoryTag::kOptim, data.device()));
  // Convert to fp32 on the host first when the state lives on a device (dtype
  // conversion is a host operation; a device bf16 source is brought back first).
  Tensor source = src;
  if (src.dtype() != DType::kFloat32 && !(data.device().is_cpu() && src.device().is_cpu())) {
    Tensor host = src;
    if (!src.device().is_cpu()) {
      ASSIGN_OR_RETURN(host, Tensor::Allocate(src.shape(), src.dtype(), MemoryTag::kOptim));
      RETURN_IF_ERROR(host.CopyFrom(src));
    }
    absl::StatusOr<Tensor> wide = host.ToDType(DType::kFloat32, MemoryTag::kOptim);
    if (!wide.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(type, ": LoadState: state tensor '", key, "': ", wide.status().message()));
    }
    source = *std::move(wide);
  }
  absl::Status copied = t.CopyFrom(source);
  if (!copied.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(type, ": LoadState: state tensor '", key, "': ", copied.message()));
  }
  return t;
}

}  // namespace

absl::Status Optimizer::LoadState(const OptimizerState& state) {
  const std::string type = TypeName();
  const std::vector<std::string> names = StateNames();
  if (state.step_count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(type, ": LoadState: step_count is ", state.step_count, "; it must be >= 0"));
  }
  std::map<std::string, size_t> index_of;
  for (size_t i = 0; i < params_.size(); ++i) index_of[params_[i].first] = i;
  std::map<std::string, std::pair<size_t, size_t>> key_of;  // key -> (param, state name)
  for (size_t i = 0; i < params_.size(); ++i) {
    for (size_t s = 0; s < names.size(); ++s) {
      key_of[absl::StrCat(params_[i].first, ".", names[s])] = {i, s};
    }
  }

  std::vector<ParamState> loaded(params_.size());
  std::set<size_t> listed;
  for (const auto& [name, steps] : state.param_steps) {
    auto it = index_of.find(name);
    if (it == index_of.end()) {
      return absl::InvalidArgumentError(absl::StrCat(type, ": LoadState: param_steps names '", name,
                                                     "', which is not one of its parameters"));
    }
    if (steps < 0) {
      return absl::InvalidArgumentError(absl::StrCat(type, ": LoadState: parameter '", name,
                                                     "' has a negative step count ", steps));
    }
    if (!listed.insert(it->second).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(type, ": LoadState: param_steps lists parameter '", name, "' twice"));
    }
    loaded[it->second].steps = steps;
    if (steps > 0) loaded[it->second].tensors.resize(names.size());
  }
  for (const auto& [key, src] : state.tensors) {
    auto it = key_of.find(key);
    if (it == key_of.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(type, ": LoadState: state tensor '", key,
                       "' is not '<parameter name>.<state name>' for any parameter; state names: [",
                       absl::StrJoin(names, ", "), "]"));
    }
    const auto [i, s] = it->second;
    ParamState& st = loaded[i];
    if (st.steps == 0) {
      return absl::InvalidArgumentError(absl::StrCat(type, ": LoadState: state tensor '", key,
                                                     "' is given but param_steps has no positive "
                                                     "step count for parameter '",
                                                     params_[i].first, "'"));
    }
    if (st.tensors[s].defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat(type, ": LoadState: state tensor '", key, "' is given twice"));
    }
    const Tensor& data = params_[i].second->data;
    if (!src.defined() || src.numel() != data.numel()) {
      return absl::InvalidArgumentError(absl::StrCat(
          type, ": LoadState: state tensor '", key, "' has ", src.defined() ? src.numel() : 0,
          " elements but parameter '", params_[i].first, "' has ", data.numel(), " elements ",
          core::ShapeToString(data.shape()),
          " (load state into an optimizer over parameters "
          "of the same layout, e.g. after wrapping with the same world size)"));
    }
    ASSIGN_OR_RETURN(Tensor t, Fp32StateTensor(type, key, src, data));
    st.tensors[s] = std::move(t);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    for (size_t s = 0; s < loaded[i].tensors.size(); ++s) {
      if (loaded[i].tensors[s].defined()) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          type, ": LoadState: parameter '", params_[i].first, "' has taken ", loaded[i].steps,
          " steps but state tensor '", params_[i].first, ".", names[s], "' is missing"));
    }
  }
  states_ = std::move(loaded);
  step_count_ = state.step_count;
  return absl::OkStatus();
}

void Optimizer::ResetState() {
  for (ParamState& st : states_) st = ParamState();
}

}  // namespace optim
