#include "core/module.h"

#include <algorithm>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/param_init.h"
#include "core/status_macros.h"

namespace core {
namespace internal {

// The hooks of one module, keyed by a registration counter so iteration follows
// registration order. Shared with HookHandles through weak pointers.
struct HookLists {
  // A forward hook and whether it runs in a recompute (HookOptions).
  template <typename Hook>
  struct Forward {
    Hook hook;
    bool in_recompute = false;
  };
  uint64_t next_id = 1;
  std::map<uint64_t, Forward<ForwardPreHook>> forward_pre;
  std::map<uint64_t, Forward<ForwardPostHook>> forward_post;
  std::map<uint64_t, BackwardPreHook> backward_pre;
  std::map<uint64_t, BackwardPostHook> backward_post;

  bool Erase(uint64_t id) {
    return forward_pre.erase(id) + forward_post.erase(id) + backward_pre.erase(id) +
               backward_post.erase(id) >
           0;
  }
  bool Contains(uint64_t id) const {
    return forward_pre.count(id) + forward_post.count(id) + backward_pre.count(id) +
               backward_post.count(id) >
           0;
  }
};

}  // namespace internal

namespace {

// `error` (a module's recorded construction error) prefixed with the module.
absl::Status OwnConstructionError(const Module& module, const absl::Status& error) {
  return Annotate(error, module.Describe());
}

// Hooks may remove themselves or others while running, so iterate over a copy.
template <typename Map>
std::vector<typename Map::mapped_type> Snapshot(const Map& hooks) {
  std::vector<typename Map::mapped_type> out;
  out.reserve(hooks.size());
  for (const auto& [id, hook] : hooks) out.push_back(hook);
  return out;
}

// The forward hooks that run in this pass: all of them, or during a recompute those
// registered with HookOptions::run_in_recompute (NOTE [Activation checkpointing]).
template <typename Hook>
std::vector<Hook> ForwardSnapshot(
    const std::map<uint64_t, internal::HookLists::Forward<Hook>>& hooks) {
  const bool recompute = InRecompute();
  std::vector<Hook> out;
  out.reserve(hooks.size());
  for (const auto& [id, entry] : hooks) {
    if (!recompute || entry.in_recompute) out.push_back(entry.hook);
  }
  return out;
}

thread_local bool in_recompute = false;

// Sets InRecompute() for its lifetime.
class RecomputeScope {
 public:
  RecomputeScope() : previous_(in_recompute) { in_recompute = true; }
  ~RecomputeScope() { in_recompute = previous_; }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;

 private:
  bool previous_;
};

}  // namespace

HookHandle::HookHandle(HookHandle&& other) noexcept
    : lists_(std::move(other.lists_)), id_(other.id_) {
  other.id_ = 0;
}

HookHandle& HookHandle::operator=(HookHandle&& other) noexcept {
  if (this != &other) {
    Remove();
    lists_ = std::move(other.lists_);
    id_ = other.id_;
    other.id_ = 0;
  }
  return *this;
}

void HookHandle::Remove() {
  if (std::shared_ptr<internal::HookLists> lists = lists_.lock()) lists->Erase(id_);
  lists_.reset();
  id_ = 0;
}

bool HookHandle::active() const {
  std::shared_ptr<internal::HookLists> lists = lists_.lock();
  return lists != nullptr && lists->Contains(id_);
}

bool InRecompute() { return in_recompute; }

Module::Module() : hooks_(std::make_shared<internal::HookLists>()) {}

Module::~Module() {
  for (auto& [name, child] : children_) {
    if (child->parent_ == this) child->parent_ = nullptr;
  }
}

absl::StatusOr<Tensor> Module::Forward(const Tensor& given) {
  if (!construction_error_.ok()) return OwnConstructionError(*this, construction_error_);
  Tensors inputs = {given};
  for (const auto& hook : ForwardSnapshot(hooks_->forward_pre)) {
    RETURN_IF_ERROR(hook(*this, inputs));
  }
  if (inputs.size() != 1) {
    return absl::InternalError(absl::StrCat(Describe(), ": a forward pre-hook left ", inputs.size(),
                                            " inputs for a one-input module"));
  }
  const Tensor input = inputs[0];
  absl::StatusOr<Tensor> impl = ForwardImpl(input);
  if (!impl.ok()) return impl.status();
  Tensors outputs = {*std::move(impl)};
  for (const auto& hook : ForwardSnapshot(hooks_->forward_post)) {
    RETURN_IF_ERROR(hook(*this, inputs, outputs));
  }
  if (outputs.size() != 1) {
    return absl::InternalError(absl::StrCat(Describe(), ": a forward post-hook left ",
                                            outputs.size(), " outputs for a one-output module"));
  }
  Tensor output = outputs[0];
  if (!GradEnabled()) {
    // No Backward follows: what ForwardImpl cached for one is dead already, here and in
    // the children (those a parent ran fused, outside their own Forward, included), so a
    // forward-only pass holds one layer's.
    DropActivations();
  } else if (checkpoint_activations_ && !InRecompute()) {
    // NOTE [Activation checkpointing]: keep the input, drop the rest.
    DropActivations();
    recompute_input_ = input;
    awaiting_recompute_ = true;
  }
  return output;
}

namespace {

// The graph's reference back to a module it will call into at backward time: weak when a
// shared_ptr owns the module (a destroyed module is then skipped), plain otherwise (a module no
// shared_ptr owns must outlive its backward).
class ModuleRef {
 public:
  explicit ModuleRef(Module& module)
      : weak_(module.weak_from_this()), owned_(!weak_.expired()), raw_(&module) {}
  // The module, kept alive by `*hold` while it is used, or null when it is gone.
  Module* Get(std::shared_ptr<Module>* hold) const {
    if (!owned_) return raw_;
    *hold = weak_.lock();
    return hold->get();
  }

 private:
  std::weak_ptr<Module> weak_;
  bool owned_;
  Module* raw_;
};

// NOTE [Graph modules]: passes gradients through unchanged, undefined ones included (an output
// nobody used costs its producers nothing). Named "<module> inputs" or "<module> outputs" only
// when a message asks, so a call spends nothing on the name.
class IdentityNode : public Node {
 public:
  IdentityNode(ModuleRef module, const char* suffix, absl::Span<const Tensor> tensors)
      : Node(tensors, tensors), module_(std::move(module)), suffix_(suffix) {}
  std::string name() const override {
    std::shared_ptr<Module> hold;
    const Module* m = module_.Get(&hold);
    return absl::StrCat(m == nullptr ? "(a destroyed module)" : m->Describe(), " ", suffix_);
  }
  bool materializes_grads() const override { return false; }
  // A gradient passes through as it arrives, so output i takes it bf16 where input i's producer
  // does (NOTE [Autograd] in core/autograd.h): hooks placed on a module's outputs keep a bf16
  // gradient the model's last op takes.
  bool takes_bf16_grad(int i) const override {
    const Edge& e = next_edges()[i];
    return e.node != nullptr && e.node->takes_bf16_grad(e.input_nr);
  }
  absl::StatusOr<std::vector<Tensor>> Apply(std::vector<Tensor> grads) override { return grads; }

 private:
  ModuleRef module_;
  const char* suffix_;
};

// New handles of the tensors of `tensors` that require gradients, all outputs of one identity
// node of `module` (its `suffix`), put in their places; the node, or null when none requires
// gradients.
std::shared_ptr<Node> PassThroughIdentity(Module& module, const char* suffix, Tensors& tensors) {
  std::vector<Tensor> inputs;
  std::vector<size_t> places;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!RequiresGrad(tensors[i])) continue;
    inputs.push_back(tensors[i]);
    places.push_back(i);
  }
  if (inputs.empty()) return nullptr;
  auto node = std::make_shared<IdentityNode>(ModuleRef(module), suffix, inputs);
  for (size_t k = 0; k < places.size(); ++k) {
    Tensor fresh = Detach(inputs[k]);
    fresh.set_autograd_meta(std::make_shared<AutogradMeta>(node, static_cast<int>(k), false));
    tensors[places[k]] = std::move(fresh);
  }
  return node;
}

// Records one node named `name` over `inputs` and the parameters of `module`'s subtree that take
// gradients, as the output of `outputs` (the defined, non-int32 ones), saving `saved`, for a
// `backward` that adds the parameters' gradients into Parameter::grad itself and returns those
// of the inputs: the parameters' accumulators then run after it with nothing to add, so the
// gradients are final when they have run (NOTE [Graph modules]).
absl::Status RecordOverSubtree(const Module& module, std::string name, const Tensors& inputs,
                               Tensors& outputs, std::vector<Tensor> saved, BackwardFn backward) {
  std::vector<Tensor> edges = inputs;
  for (const ParameterPtr& p : module.Parameters()) {
    if (p->requires_grad) edges.push_back(Value(p));
  }
  std::vector<Tensor*> recorded;
  for (Tensor& t : outputs) {
    if (t.defined() && t.dtype() != DType::kInt32) recorded.push_back(&t);
  }
  const size_t num_edges = edges.size();
  BackwardFn padded = [backward = std::move(backward), num_edges](
                          const BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
    ASSIGN_OR_RETURN(std::vector<Tensor> grads, backward(ctx));
    grads.resize(num_edges);
    return grads;
  };
  return RecordFunction(std::move(name), edges, recorded, std::move(saved), std::move(padded));
}

}  // namespace

// NOTE [Graph modules]: a hand-written module called from a graph (Call): its ForwardImpl, and
// one node whose backward is its BackwardImpl (Call places the hooks).
absl::StatusOr<Tensors> Module::ForwardGraph(const Tensors& inputs) {
  if (in_default_kind_bridge_) {
    return absl::UnimplementedError(
        absl::StrCat(Describe(), " overrides neither ForwardGraph nor ForwardImpl"));
  }
  if (inputs.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(), " has a hand-written backward and takes one tensor; it was given ",
                     inputs.size()));
  }
  in_default_kind_bridge_ = true;
  absl::StatusOr<Tensor> y = ForwardImpl(Detach(inputs[0]));
  in_default_kind_bridge_ = false;
  if (!y.ok()) return y.status();
  Tensors outputs = {*std::move(y)};
  if (!GradEnabled()) {
    DropActivations();  // as Forward: no Backward follows
    return outputs;
  }
  RETURN_IF_ERROR(RecordOverSubtree(
      *this, Describe(), inputs, outputs, {},
      [ref = ModuleRef(*this)](const BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        std::shared_ptr<Module> hold;
        Module* m = ref.Get(&hold);
        if (m == nullptr) return absl::FailedPreconditionError("the module no longer exists");
        ASSIGN_OR_RETURN(Tensor grad_input, m->BackwardImpl(ctx.grad(0)));
        return std::vector<Tensor>{std::move(grad_input)};
      }));
  return outputs;
}

namespace {

// A stand-in for `t` without its storage (Tensor::Meta) carrying its autograd record.
Tensor RecordOnly(const Tensor& t) {
  Tensor stub = Tensor::Meta(t.shape(), t.dtype(), t.device());
  stub.set_autograd_meta(t.autograd_meta());
  return stub;
}

}  // namespace

// A graph module run through Forward: ForwardGraph on a leaf handle of the input, keeping the
// output for Backward.
absl::StatusOr<Tensor> Module::ForwardImpl(const Tensor& input) {
  if (in_default_kind_bridge_) {
    return absl::UnimplementedError(
        absl::StrCat(Describe(), " overrides neither ForwardGraph nor ForwardImpl"));
  }
  graph_input_ = Tensor();
  graph_output_ = Tensor();
  const bool record = GradEnabled();
  const Tensor in =
      record && input.defined() && input.dtype() != DType::kInt32 ? Leaf(input) : Detach(input);
  in_default_kind_bridge_ = true;
  absl::StatusOr<Tensors> outputs = ForwardGraph({in});
  in_default_kind_bridge_ = false;
  if (!outputs.ok()) return outputs.status();
  if (outputs->size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(), " returned ", outputs->size(),
                     " outputs; Forward needs exactly one (use Call)"));
  }
  if (record) {
    // Records only, not the data: the caller decides how long the tensors live.
    graph_input_ = RecordOnly(in);
    graph_output_ = RecordOnly((*outputs)[0]);
  }
  return (*outputs)[0];
}

// A graph module run through Forward: the Backward of the graph its Forward recorded.
absl::StatusOr<Tensor> Module::BackwardImpl(const Tensor& grad_output) {
  if (!graph_input_.is_meta()) {
    return absl::FailedPreconditionError(absl::StrCat(
        Describe(), ": Backward without a Forward under grad mode since the last Backward"));
  }
  const Tensor in = std::move(graph_input_);
  const Tensor out = std::move(graph_output_);
  graph_input_ = Tensor();
  graph_output_ = Tensor();
  if (RequiresGrad(out)) RETURN_IF_ERROR(core::Backward({out}, {grad_output}));
  return RequiresGrad(in) ? LeafGrad(in) : Tensor();
}

// Runs one kind of this module's backward hooks from the graph, if the module still exists.
std::function<absl::Status()> Module::GraphHookRunner(bool post) {
  return [ref = ModuleRef(*this), post]() -> absl::Status {
    std::shared_ptr<Module> hold;
    Module* module = ref.Get(&hold);
    if (module == nullptr) return absl::OkStatus();  // the module is gone
    Module& m = *module;
    if (post) {
      for (const auto& hook : Snapshot(m.hooks_->backward_post)) RETURN_IF_ERROR(hook(m));
    } else {
      for (const auto& hook : Snapshot(m.hooks_->backward_pre)) RETURN_IF_ERROR(hook(m));
    }
    return absl::OkStatus();
  };
}

absl::StatusOr<Tensors> Module::Call(const std::vector<Arg>& args) {
  Tensors inputs;
  inputs.reserve(args.size());
  for (const Arg& a : args) {
    RETURN_IF_ERROR(a.status());
    inputs.push_back(a.tensor());
  }
  if (!construction_error_.ok()) return OwnConstructionError(*this, construction_error_);
  for (const auto& hook : ForwardSnapshot(hooks_->forward_pre)) {
    RETURN_IF_ERROR(hook(*this, inputs));
  }
  const bool place =
      GradEnabled() && (!hooks_->backward_pre.empty() || !hooks_->backward_post.empty());
  bool post_placed = false;
  if (place && !hooks_->backward_post.empty()) {
    std::shared_ptr<Node> node = PassThroughIdentity(*this, "inputs", inputs);
    if (node != nullptr) {
      node->AddPostHook(GraphHookRunner(/*post=*/true));
      post_placed = true;
    }
  }
  const bool checkpoint = checkpoint_activations_ && GradEnabled() && !InRecompute();
  ASSIGN_OR_RETURN(Tensors outputs,
                   checkpoint ? CheckpointedForward(inputs) : ForwardGraph(inputs));
  if (checkpoint) awaiting_recompute_ = true;
  for (const auto& hook : ForwardSnapshot(hooks_->forward_post)) {
    RETURN_IF_ERROR(hook(*this, inputs, outputs));
  }
  if (place) {
    std::shared_ptr<Node> node = PassThroughIdentity(*this, "outputs", outputs);
    if (node != nullptr) {
      std::function<absl::Status()> pre = GraphHookRunner(/*post=*/false);
      std::function<absl::Status()> late_post;
      if (!post_placed && !hooks_->backward_post.empty()) late_post = GraphHookRunner(true);
      // Before the identity node runs: once every consumer of the outputs has delivered, so a
      // module's backward nests inside its consumers' also when one output goes straight to
      // the loss (a mixture-of-experts block's balance loss).
      node->AddPreHook([pre, late_post](std::vector<Tensor>&) -> absl::Status {
        RETURN_IF_ERROR(pre());
        if (late_post) {  // inner modules' first (CallbackOrder::kBeforeEarlier)
          RETURN_IF_ERROR(QueueBackwardCallback(late_post, CallbackOrder::kBeforeEarlier));
        }
        return absl::OkStatus();
      });
    }
  }
  return outputs;
}

absl::StatusOr<Tensors> Module::CheckpointedForward(const Tensors& inputs) {
  Tensors outputs;
  {
    NoGradScope no_graph;
    ASSIGN_OR_RETURN(outputs, ForwardGraph(inputs));
  }
  std::vector<bool> needs;
  for (const Tensor& t : inputs) needs.push_back(RequiresGrad(t));
  BackwardFn recompute = [ref = ModuleRef(*this), needs](
                             const BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
    std::shared_ptr<Module> hold;
    Module* module = ref.Get(&hold);
    if (module == nullptr) {
      return absl::FailedPreconditionError("the checkpointed module no longer exists");
    }
    Module& m = *module;
    m.awaiting_recompute_ = false;
    Tensors leaves;
    for (size_t i = 0; i < needs.size(); ++i) {
      leaves.push_back(needs[i] ? Leaf(ctx.saved(static_cast<int>(i)))
                                : ctx.saved(static_cast<int>(i)));
    }
    EnableGradScope grad_on;
    RecomputeScope recomputing;
    absl::StatusOr<Tensors> again = m.ForwardGraph(leaves);
    if (!again.ok()) {
      return Annotate(again.status(),
                      absl::StrCat(m.Describe(), ": recomputing the checkpointed forward"));
    }
    std::vector<Tensor> roots, seeds;
    int k = 0;
    for (const Tensor& t : *again) {
      if (!t.defined() || t.dtype() == DType::kInt32) continue;
      if (RequiresGrad(t)) {
        roots.push_back(t);
        seeds.push_back(ctx.grad(k));
      }
      ++k;
    }
    if (!roots.empty()) RETURN_IF_ERROR(core::Backward(roots, seeds));
    std::vector<Tensor> grads(needs.size());
    for (size_t i = 0; i < needs.size(); ++i) {
      if (needs[i]) grads[i] = LeafGrad(leaves[i]);
    }
    return grads;  // the parameters' gradients are in Parameter::grad already
  };
  std::vector<Tensor> saved(inputs.begin(), inputs.end());
  RETURN_IF_ERROR(RecordOverSubtree(*this, absl::StrCat("Checkpoint ", Describe()), inputs, outputs,
                                    std::move(saved), std::move(recompute)));
  return outputs;
}

absl::StatusOr<Tensor> Module::CallOne(const std::vector<Arg>& inputs) {
  ASSIGN_OR_RETURN(Tensors outputs, Call(inputs));
  if (outputs.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(Describe(), " returned ", outputs.size(),
                                                   " outputs; CallOne needs exactly one"));
  }
  return outputs[0];
}

absl::StatusOr<Tensor> Module::Backward(const Tensor& grad_output) {
  if (!construction_error_.ok()) return OwnConstructionError(*this, construction_error_);
  for (const auto& hook : Snapshot(hooks_->backward_pre)) {
    RETURN_IF_ERROR(hook(*this));
  }
  if (awaiting_recompute_) {
    // NOTE [Activation checkpointing]: rebuild the caches the Forward dropped.
    const Tensor input = std::move(recompute_input_);
    recompute_input_ = Tensor();
    awaiting_recompute_ = false;
    // With grad mode on, as the Forward it repeats (a Backward may run inside a graph's
    // backward, where it is off), so the subtree keeps what its backward needs.
    EnableGradScope grad_on;
    RecomputeScope recompute;
    absl::StatusOr<Tensor> again = ForwardImpl(input);
    if (!again.ok()) {
      return Annotate(again.status(),
                      absl::StrCat(Describe(), ": recomputing the checkpointed forward"));
    }
  }
  absl::StatusOr<Tensor> grad_input = BackwardImpl(grad_output);
  if (!grad_input.ok()) return grad_input.status();
  for (const auto& hook : Snapshot(hooks_->backward_post)) {
    RETURN_IF_ERROR(hook(*this));
  }
  return grad_input;
}

void Module::DropActivations() {
  for (Module* m : Subtree()) {
    m->ReleaseActivations();
    m->recompute_input_ = Tensor();
    m->awaiting_recompute_ = false;
    m->graph_input_ = Tensor();
    m->graph_output_ = Tensor();
  }
}

std::vector<Module*> Module::Subtree() const {
  // Iterative pre-order walk: modules may be shared (listed once) and deep.
  std::vector<Module*> out;
  std::unordered_set<const Module*> seen;
  std::vector<Module*> stack = {const_cast<Module*>(this)};
  while (!stack.empty()) {
    Module* m = stack.back();
    stack.pop_back();
    if (!seen.insert(m).second) continue;
    out.push_back(m);
    for (auto it = m->children_.rbegin(); it != m->children_.rend(); ++it) {
      stack.push_back(it->second.get());
    }
  }
  return out;
}

HookHandle Module::RegisterForwardPreHook(ForwardPreHook hook, HookOptions options) {
  const uint64_t id = hooks_->next_id++;
  hooks_->forward_pre.emplace(
      id, internal::HookLists::Forward<ForwardPreHook>{std::move(hook), options.run_in_recompute});
  return HookHandle(hooks_, id);
}

HookHandle Module::RegisterForwardPostHook(ForwardPostHook hook, HookOptions options) {
  const uint64_t id = hooks_->next_id++;
  hooks_->forward_post.emplace(
      id, internal::HookLists::Forward<ForwardPostHook>{std::move(hook), options.run_in_recompute});
  return HookHandle(hooks_, id);
}

HookHandle Module::RegisterBackwardPreHook(BackwardPreHook hook) {
  const uint64_t id = hooks_->next_id++;
  hooks_->backward_pre.emplace(id, std::move(hook));
  return HookHandle(hooks_, id);
}

HookHandle Module::RegisterBackwardPostHook(BackwardPostHook hook) {
  const uint64_t id = hooks_->next_id++;
  hooks_->backward_post.emplace(id, std::move(hook));
  return HookHandle(hooks_, id);
}

int Module::NumHooks() const {
  return static_cast<int>(hooks_->forward_pre.size() + hooks_->forward_post.size() +
                          hooks_->backward_pre.size() + hooks_->backward_post.size());
}

ParameterPtr Module::RegisterParameter(const std::string& name, Tensor data, bool requires_grad) {
  return RegisterParameter(name, Parameter::Make(std::move(data), requires_grad));
}

ParameterPtr Module::RegisterParameter(const std::string& name, ParameterPtr parameter) {
  own_parameters_.emplace_back(name, parameter);
  return parameter;
}

ParameterPtr Module::AllocateParameter(const std::string& name, const Shape& shape, DType dtype,
                                       bool requires_grad) {
  // NOTE [Deferred initialisation] (core/param_init.h): shape and dtype, no storage.
  if (DeferredInitScope::Active()) {
    return RegisterParameter(name, Tensor::Meta(shape, dtype), requires_grad);
  }
  absl::StatusOr<Tensor> data = Tensor::Allocate(shape, dtype, MemoryTag::kParam);
  if (data.ok()) return RegisterParameter(name, *std::move(data), requires_grad);
  if (construction_error_.ok()) {
    construction_error_ = Annotate(data.status(), absl::StrCat("parameter '", name, "'"));
  }
  // Zero bytes: cannot fail, whatever the allocator's limit.
  return RegisterParameter(name, Tensor::Empty(Shape(shape.size(), 0), dtype, MemoryTag::kParam),
                           requires_grad);
}

ParameterPtr Module::AllocateParameter(const std::string& name, const Shape& shape,
                                       const ParamInit& init) {
  ParameterPtr p = AllocateParameter(name, shape);
  // An fp32 CPU tensor or a deferred one: the fill cannot fail; kept like an allocation
  // failure all the same.
  if (absl::Status s = InitParameter(*p, init); !s.ok() && construction_error_.ok()) {
    construction_error_ = Annotate(s, absl::StrCat("parameter '", name, "'"));
  }
  return p;
}

absl::Status Module::ConstructionStatus() const {
  for (const Module* m : Subtree()) {
    if (!m->construction_error_.ok()) return OwnConstructionError(*m, m->construction_error_);
  }
  return absl::OkStatus();
}

void Module::AddChild(const std::string& name, std::shared_ptr<Module> module) {
  if (module->parent_ == nullptr) {
    module->parent_ = this;
    module->name_in_parent_ = name;
  }
  children_.emplace_back(name, std::move(module));
}

namespace {

void CollectParameters(const Module& module, const std::string& prefix,
                       std::unordered_set<const Parameter*>* seen,
                       std::unordered_set<const Module*>* visited,
                       std::vector<NamedParameter>* out) {
  if (!visited->insert(&module).second) return;
  for (const auto& [name, p] : module.OwnParameters()) {
    if (seen->insert(p.get()).second) out->emplace_back(prefix + name, p);
  }
  for (const auto& [name, child] : module.NamedChildren()) {
    CollectParameters(*child, prefix + name + ".", seen, visited, out);
  }
}

void CollectModules(const std::shared_ptr<Module>& module, const std::string& path,
                    std::unordered_set<const Module*>* seen, std::vector<NamedModule>* out) {
  if (!seen->insert(module.get()).second) return;
  out->emplace_back(path, module);
  for (const auto& [name, child] : module->NamedChildren()) {
    CollectModules(child, path.empty() ? name : path + "." + name, seen, out);
  }
}

}  // namespace

std::vector<NamedParameter> Module::NamedParameters() const {
  std::vector<NamedParameter> out;
  std::unordered_set<const Parameter*> seen;
  std::unordered_set<const Module*> visited;
  CollectParameters(*this, "", &seen, &visited, &out);
  return out;
}

std::vector<ParameterPtr> Module::Parameters() const {
  std::vector<ParameterPtr> out;
  for (auto& [name, p] : NamedParameters()) out.push_back(std::move(p));
  return out;
}

std::vector<NamedModule> Module::NamedModules() {
  std::vector<NamedModule> out;
  std::unordered_set<const Module*> seen;
  CollectModules(shared_from_this(), "", &seen, &out);
  return out;
}

int64_t Module::NumParameterElements() const {
  int64_t n = 0;
  for (const auto& [name, p] : NamedParameters()) n += p->data.numel();
  return n;
}

void Module::ZeroGrad(bool set_to_none) {
  for (const auto& [name, p] : NamedParameters()) {
    if (set_to_none) {
      p->grad = Tensor();
    } else {
      p->grad.Zero();
    }
  }
}

std::string Module::Path() const {
  std::vector<std::string> parts;
  for (const Module* m = this; m->parent_ != nullptr; m = m->parent_) {
    parts.push_back(m->name_in_parent_);
  }
  std::reverse(parts.begin(), parts.end());
  return absl::StrJoin(parts, ".");
}

std::string Module::Describe() const {
  const std::string path = Path();
  return absl::StrCat(path.empty() ? "<root>" : path, " (", TypeName(), ")");
}

}  // namespace core
