// Module: the base of every layer and model. Two kinds of module share it:
//
// Graph modules (NOTE [Graph modules]) write only their forward, composed of differentiable
// ops (nn/functional) and other modules, with any number of tensors in and out; the autograd
// graph (core/autograd.h) differentiates it.
//
//   class Gate : public core::Module {
//    public:
//     Gate() { w_ = RegisterParameter("weight", core::Tensor::Zeros({8, 8})); }
//     std::string TypeName() const override { return "Gate"; }
//    protected:
//     absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& in) override {
//       // in[0]: activations [N, 8]; in[1]: a mask [N, 8]
//       absl::StatusOr<core::Tensor> y = F::Mul(F::Linear(in[0], w_), in[1]);
//       RETURN_IF_ERROR(y.status());
//       return core::Tensors{*y};
//     }
//    private:
//     core::ParameterPtr w_;
//   };
//
//   ASSIGN_OR_RETURN(core::Tensors out, gate->Call({x, mask}));
//   ASSIGN_OR_RETURN(core::Tensor y, gate->CallOne({x, mask}));   // exactly one output
//
// Modules with a hand-written backward (nn's layers: a fused kernel with its own derivative)
// take one tensor and return one: a non-virtual Forward/Backward runs the hooks around the
// protected virtual ForwardImpl/BackwardImpl, and a module caches what its backward needs
// during forward: call Backward once after each Forward, with the gradient of that Forward's
// output.
//
// The two kinds mix: a graph module calls a hand-written child through Call (its
// ForwardImpl runs in the forward, its BackwardImpl as one node of the graph, the hooks
// placed as for any call), and a graph module of one input and one output may be run as a
// hand-written one (Forward records its graph, Backward runs it and returns the input's
// gradient), once per Forward as a hand-written module.
//
// Either kind runs the registered hooks, so code that acts before or after a module computes
// (FSDP's all-gathers and reduce-scatters) does so without changing the module or inserting a
// wrapper:
//
//   core::HookHandle h = module->RegisterForwardPreHook(
//       [](core::Module& m, core::Tensors& inputs) { return absl::OkStatus(); });
//   // The hook is removed when `h` is destroyed or h.Remove() is called.
//
// NOTE [Graph modules]: Call(inputs) runs the forward pre-hooks (they see the inputs and may
// replace them), ForwardGraph, then the post-hooks (they see inputs and outputs and may
// replace the outputs). With grad mode on, it also places the backward hooks on the graph, as
// FSDP2 does:
//   - the backward pre-hooks run when the gradients of the call's outputs have all arrived in
//     a Backward (an identity node over the outputs that require gradients, whose pre-hook
//     runs them), so before any node of the module's backward and after every consumer of
//     its outputs: a module's backward nests inside its consumers' backward, also when one of
//     its outputs goes straight to the loss while another feeds the next module;
//   - the backward post-hooks run when the gradients of the call's inputs have been computed
//     (an identity node over the inputs that require gradients, whose post-hook runs them):
//     every node of the call has run by then, and since a leaf's accumulator runs as soon as
//     its last consumer delivered (NOTE [Autograd]), so has every accumulator of the
//     parameters the call used, whose gradients are then final as far as this call goes.
//     Where no input requires gradients (token ids, or input data), they run once the
//     Backward's last node has run (a callback queued by the pre-hook node), inner modules'
//     before outer ones' (core::CallbackOrder::kBeforeEarlier), as everywhere else.
// Each call places its own nodes, so a module called twice in one forward (shared weights)
// sees its backward hooks twice, once per call, in reverse call order. No nodes are placed
// when the module has no backward hooks, under NoGradScope, or when no output requires
// gradients.
// A checkpointed graph module (set_checkpoint_activations) runs ForwardGraph without a graph
// and records one node ("Checkpoint <Describe()>") over its inputs (saved, version-checked)
// and its subtree's parameters. Its backward, which runs after the module's backward
// pre-hooks, calls ForwardGraph again on the saved inputs with grad mode on and
// InRecompute() true (the module's own forward hooks do not run; a descendant's run only if
// registered with HookOptions::run_in_recompute, and its backward hooks are placed as
// usual), then a nested Backward through that graph, which adds the parameters' gradients
// into Parameter::grad and gives the inputs' gradients: the bits of the plain run.
// NOTE [Activation checkpointing]: a module with set_checkpoint_activations(true) trades
// compute for memory. Its Forward (with gradients enabled, outside a recompute) runs
// the pre-hooks, ForwardImpl and the post-hooks as always, then drops what every module
// of its subtree cached for the backward (DropActivations) and keeps only a reference
// to its input. Its Backward runs the backward pre-hooks first (where fsdp gathers the
// unit's parameters: the all-gather the backward makes anyway), then recomputes:
// ForwardImpl again on the kept input with InRecompute() true, which rebuilds every
// cache bit for bit (a ForwardImpl is a deterministic function of its input and
// parameters; every layer here is), then BackwardImpl and the post-hooks, and lets the
// input go. So the gradients are the bits of the uncheckpointed run, at the price of
// one more ForwardImpl of the module per step. During the recompute:
//   - the module's own forward hooks do not run (the recompute calls ForwardImpl, not
//     Forward), and a descendant's Forward runs only the forward hooks registered with
//     HookOptions::run_in_recompute (fsdp's: they gather a nested unit for the backward
//     that follows and record nothing), so a user's hooks fire once per forward pass;
//   - checkpointed descendants do not checkpoint again: the recompute keeps the whole
//     subtree's caches for the backward that follows.
// Under a NoGradScope (evaluation: no backward follows) a checkpointed module runs as a
// plain one, and every module drops its subtree's caches as its Forward returns
// (DropActivations: also those of children a parent ran fused, outside their own
// Forward), so a forward-only pass holds at most one layer's caches at a time
// and no Backward can follow it. As for every cached input, the input tensor must not be written
// between Forward and Backward.
#ifndef CORE_MODULE_H_
#define CORE_MODULE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/autograd.h"
#include "core/parameter.h"
#include "core/tensor.h"

namespace core {

class Module;

// Tensors passed to or returned by a module.
using Tensors = std::vector<Tensor>;

// Forward hooks see the inputs (a hand-written module's one input as a Tensors of one) and
// may replace them (pre) or the outputs (post). Backward hooks mark when a module's backward
// begins (pre) and when its parameter gradients are final (post).
using ForwardPreHook = std::function<absl::Status(Module& module, Tensors& inputs)>;
using ForwardPostHook =
    std::function<absl::Status(Module& module, const Tensors& inputs, Tensors& outputs)>;
using BackwardPreHook = std::function<absl::Status(Module& module)>;
using BackwardPostHook = std::function<absl::Status(Module& module)>;

namespace internal {
struct HookLists;
}  // namespace internal

// How a hook takes part in a recompute (NOTE [Activation checkpointing]).
struct HookOptions {
  // Run this forward hook also while a checkpointed ancestor recomputes its forward
  // inside Backward (InRecompute() tells the hook which pass it is in). False: the hook
  // sees each forward pass once.
  bool run_in_recompute = false;
};

// GradEnabled() and NoGradScope (core/autograd.h) also mark forwards that no Backward
// follows (evaluation): there checkpointed modules run as plain ones and every module drops
// its caches as its Forward returns (NOTE [Activation checkpointing]).

// True on this thread while a checkpointed module recomputes its forward inside its
// Backward (NOTE [Activation checkpointing]).
bool InRecompute();

// Owns one registered hook; removes it when destroyed or on Remove(). Safe to destroy
// after the module is gone. Movable, not copyable.
class HookHandle {
 public:
  HookHandle() = default;
  HookHandle(std::weak_ptr<internal::HookLists> lists, uint64_t id)
      : lists_(std::move(lists)), id_(id) {}
  ~HookHandle() { Remove(); }
  HookHandle(HookHandle&& other) noexcept;
  HookHandle& operator=(HookHandle&& other) noexcept;
  HookHandle(const HookHandle&) = delete;
  HookHandle& operator=(const HookHandle&) = delete;

  // Unregisters the hook; a no-op when already removed.
  void Remove();
  // True while the hook is registered.
  bool active() const;

 private:
  std::weak_ptr<internal::HookLists> lists_;
  uint64_t id_ = 0;
};

using NamedParameter = std::pair<std::string, ParameterPtr>;
using NamedModule = std::pair<std::string, std::shared_ptr<Module>>;

class Module : public std::enable_shared_from_this<Module> {
 public:
  Module();
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // NOTE [Graph modules]: a module's forward on the graph, with its hooks. An Arg holding an
  // error (an earlier op's) is returned unchanged. A hand-written module takes one input here
  // (InvalidArgument naming it otherwise) and its backward runs as one node of the graph.
  absl::StatusOr<Tensors> Call(const std::vector<Arg>& inputs);
  // Call for a module of exactly one output (InvalidArgument naming the module otherwise).
  absl::StatusOr<Tensor> CallOne(const std::vector<Arg>& inputs);

  // A forward of one tensor in and one out, for Backward to follow: runs forward pre-hooks
  // (registration order), ForwardImpl, then post-hooks, which may replace the output. The
  // first error stops the chain and is returned. A graph module of one input and one output
  // runs its ForwardGraph on the graph, and Backward runs that graph (InvalidArgument
  // naming the module for any other number of outputs).
  absl::StatusOr<Tensor> Forward(const Tensor& input);

  // Runs backward pre-hooks, BackwardImpl (which adds parameter gradients into
  // Parameter::grad and returns the input gradient; undefined where the input has none,
  // such as token ids), then post-hooks.
  absl::StatusOr<Tensor> Backward(const Tensor& grad_output);

  ABSL_MUST_USE_RESULT HookHandle RegisterForwardPreHook(ForwardPreHook hook,
                                                         HookOptions options = {});
  ABSL_MUST_USE_RESULT HookHandle RegisterForwardPostHook(ForwardPostHook hook,
                                                          HookOptions options = {});
  ABSL_MUST_USE_RESULT HookHandle RegisterBackwardPreHook(BackwardPreHook hook);
  ABSL_MUST_USE_RESULT HookHandle RegisterBackwardPostHook(BackwardPostHook hook);

  // Number of hooks of all kinds currently registered on this module (not children).
  int NumHooks() const;

  // "Linear", "TransformerBlock", ...
  virtual std::string TypeName() const = 0;

  // Every parameter of this module and its descendants, depth first in registration
  // order (own parameters before children's), with dotted names such as
  // "blocks.0.attn.qkv.weight". A parameter reachable twice (tied) is listed once,
  // under the first name.
  std::vector<NamedParameter> NamedParameters() const;
  std::vector<ParameterPtr> Parameters() const;

  // This module (name "") and every descendant, pre-order, each listed once.
  std::vector<NamedModule> NamedModules();

  // Direct children in registration order.
  const std::vector<NamedModule>& NamedChildren() const { return children_; }

  // Parameters registered on this module itself, in registration order.
  const std::vector<NamedParameter>& OwnParameters() const { return own_parameters_; }

  // Total elements of Parameters() (tied parameters counted once).
  int64_t NumParameterElements() const;

  // NOTE [Activation checkpointing]: whether Forward drops this subtree's activations
  // and Backward recomputes them. Off by default; fsdp sets it on the modules a wrap's
  // checkpoint policy picks (FullyShardOptions::checkpoint_policy).
  void set_checkpoint_activations(bool checkpoint) { checkpoint_activations_ = checkpoint; }
  bool checkpoint_activations() const { return checkpoint_activations_; }
  // True from a checkpointed Forward (or Call) until the Backward that recomputes it.
  bool awaiting_recompute() const { return awaiting_recompute_; }

  // Frees what every module of the subtree (each once) cached for its Backward
  // (ReleaseActivations) and the inputs checkpointed modules kept: only a new Forward
  // makes a Backward possible again.
  void DropActivations();

  // Zeroes every defined gradient in the subtree, or drops them if `set_to_none`.
  void ZeroGrad(bool set_to_none = false);

  // Dotted path from the outermost module that registered this one as a (grand)child,
  // e.g. "blocks.1.attn"; "" for a module nobody registered. Used in error messages.
  std::string Path() const;

  // Path() for messages: the path, or "<root>" for the root, plus the type name.
  std::string Describe() const;

  // OK, or the first parameter allocation that failed while this module or a
  // descendant (pre-order) was constructed (AllocateParameter), as ResourceExhausted
  // (or the allocator's code) "<Describe()>: parameter '<name>': <why>". Code that builds
  // a model from user-given sizes checks it once after construction; a module holding
  // such an error also fails every Forward and Backward with it.
  absl::Status ConstructionStatus() const;

 protected:
  // A graph module's forward (NOTE [Graph modules]): outputs from inputs, through
  // differentiable ops and children's Call. The default serves a hand-written module called
  // from a graph: its ForwardImpl, and one node whose backward is its BackwardImpl.
  virtual absl::StatusOr<Tensors> ForwardGraph(const Tensors& inputs);

  // A hand-written module's forward and backward. The defaults serve a graph module of one
  // input and one output run through Forward and Backward: ForwardGraph on a leaf handle of
  // the input, then core::Backward from its output, returning the input's gradient.
  virtual absl::StatusOr<Tensor> ForwardImpl(const Tensor& input);
  virtual absl::StatusOr<Tensor> BackwardImpl(const Tensor& grad_output);

  // Drops this module's own cached activations (not its children's); called by
  // DropActivations. The default holds nothing. A module that does not override it is
  // still correct under checkpointing (the recompute overwrites its caches); it only
  // keeps their memory.
  virtual void ReleaseActivations() {}

  // Registers a parameter under `name` and returns it. Registering an existing
  // Parameter object under a second name ties it (it appears once in NamedParameters).
  ParameterPtr RegisterParameter(const std::string& name, Tensor data, bool requires_grad = true);
  ParameterPtr RegisterParameter(const std::string& name, ParameterPtr parameter);

  // Registers parameter `name` as a new uninitialised CPU tensor of `shape` (tag
  // kParam), for constructors that size parameters from user input and cannot return
  // an error; under a core::DeferredInitScope, as a meta tensor of that shape with no
  // storage (NOTE [Deferred initialisation] in core/param_init.h), which cannot fail. When
  // Tensor::Allocate fails (the size overflows, exceeds the allocator's limit or memory runs out)
  // it registers an empty tensor of the same rank (every dimension 0) instead, records the error
  // for ConstructionStatus() and makes this module's Forward and Backward return it. Never aborts.
  ParameterPtr AllocateParameter(const std::string& name, const Shape& shape,
                                 DType dtype = DType::kFloat32, bool requires_grad = true);
  // The same (fp32, requires_grad), with `init` recorded as its recipe and its values filled
  // from it (core::InitParameter: only recorded under a DeferredInitScope).
  ParameterPtr AllocateParameter(const std::string& name, const Shape& shape,
                                 const ParamInit& init);

  template <typename M>
  std::shared_ptr<M> RegisterModule(const std::string& name, std::shared_ptr<M> module) {
    AddChild(name, module);
    return module;
  }

 private:
  void AddChild(const std::string& name, std::shared_ptr<Module> module);
  // NOTE [Graph modules]: runs this module's backward pre- or post-hooks from the graph.
  std::function<absl::Status()> GraphHookRunner(bool post);
  // NOTE [Activation checkpointing] of a graph module: ForwardGraph without a graph, and one
  // node that recomputes it in the backward.
  absl::StatusOr<Tensors> CheckpointedForward(const Tensors& inputs);
  // This module and every descendant, pre-order, each once (no shared_from_this, so it
  // also works during construction and for modules not owned by a shared_ptr).
  std::vector<Module*> Subtree() const;

  std::vector<NamedParameter> own_parameters_;
  std::vector<NamedModule> children_;
  // The module that registered this one first, and under which name; cleared when that
  // parent is destroyed.
  Module* parent_ = nullptr;
  std::string name_in_parent_;
  std::shared_ptr<internal::HookLists> hooks_;
  // The first failed AllocateParameter ("parameter 'w': ..."), without the module prefix.
  absl::Status construction_error_;
  // NOTE [Activation checkpointing].
  bool checkpoint_activations_ = false;
  bool awaiting_recompute_ = false;  // from a checkpointed Forward to its Backward
  Tensor recompute_input_;           // the input that Forward kept
  // A graph module run through Forward: its leaf input and its output, until Backward.
  Tensor graph_input_;
  Tensor graph_output_;
  // True while a default ForwardGraph or ForwardImpl calls the other (one that is not
  // overridden either is Unimplemented instead of recursing).
  bool in_default_kind_bridge_ = false;
};

}  // namespace core

#endif  // CORE_MODULE_H_
