// Autograd: define-by-run reverse-mode differentiation. A differentiable op (nn/functional,
// or a custom function written with RecordFunction) that computes outputs from tensors that
// require gradients records a Node on its outputs: the op's name, what its backward needs
// (saved tensors) and the edges to the nodes of its inputs. Backward(loss) then runs that
// graph once in reverse.
//
//   core::Tensor x = core::Leaf(core::Tensor::FromVector({1, 2, 3}, {3}).value());
//   absl::StatusOr<core::Tensor> y = F::Mul(x, x);           // records "Mul"
//   absl::StatusOr<core::Tensor> loss = F::Sum(y);           // records "Sum"
//   RETURN_IF_ERROR(loss.status());
//   RETURN_IF_ERROR(core::Backward(*loss));                  // dloss/dx = 2x
//   core::Tensor g = core::LeafGrad(x);                      // {2, 4, 6}
//
// NOTE [Autograd]
// - Records. A Tensor handle carries an AutogradMeta: the node that produced it and which of
//   that node's outputs it is, or, for a leaf, the node that accumulates its gradient. A
//   Parameter is a leaf: core::Value(p) (or passing the ParameterPtr to an op, through Arg)
//   gives p->data with the parameter's shared leaf record, whose node adds every gradient
//   that reaches it into Parameter::grad, the tensors FSDP points at. Plain tensors become
//   leaves through Leaf(t); LeafGrad(t) reads what accumulated there.
// - Grad mode. Under NoGradScope nothing is recorded and nothing is saved: evaluation and
//   inference run there. Detach(t) gives the same storage without a record.
// - Order. Every node gets a sequence number when it is made (one counter for the process),
//   so a consumer's number is above its producers'. Backward counts, for each node it can
//   reach from the roots, the edges that point at it; a node runs when all of them have
//   delivered, and among the nodes ready to run the one with the highest number runs first
//   (the reverse of the forward, as a hand-written backward); a leaf's accumulator outranks
//   every op, so a parameter's gradient lands in Parameter::grad as soon as its last
//   consumer delivered it. One thread runs the whole
//   graph, so the order, and with it every sum, is fixed by the graph alone: a tensor used
//   several times gets its gradients added in the order its consumers ran (a + b, then + c),
//   and the bits never depend on scheduling.
// - Gradients. A node's backward receives one gradient per output of its op; where no
//   gradient arrived for an output the engine passes zeros (nodes of one output run only
//   when a gradient arrived; a node may take undefined ones instead:
//   Node::materializes_grads), and returns one gradient per input (undefined: none, and a
//   node that receives none at all is skipped). A gradient is on the output's device, shaped
//   like the tensor it belongs to, and fp32 or bf16 (checked where it arrives:
//   InvalidArgument naming the op). A bf16 one reaches the receiving node as it is only
//   where that node takes bf16 for that output (Node::takes_bf16_grad: a fused step whose
//   bf16 GEMM would round it anyway, so the producer that stored it bf16 saves the receiver
//   a pass) and is the only gradient of its tensor; otherwise the engine widens it to fp32
//   (exactly) before it is used or summed. Sums and leaf gradients are fp32.
// - Saved tensors (SavedTensor) keep a handle without a record (no cycle through the node)
//   and the storage's version (Storage::version, bumped by every in-place write through the
//   Tensor API); unpacking a tensor whose storage was written since is FailedPrecondition
//   naming the op and the tensor. A parameter leaf is saved by reference: the backward reads
//   Parameter::data as it is then (what FSDP gathered for it), checked for the shape and
//   dtype it had when saved. A node frees its saved tensors as it runs; running a freed
//   node again (a second Backward through the same graph) is FailedPrecondition naming the
//   op and its first saved tensor, unless the first Backward kept the graph
//   (BackwardOptions::retain_graph).
// - Backward functions run with grad mode off (no higher-order gradients) and may add a
//   parameter input's gradient into Parameter::grad themselves (BackwardContext::parameter):
//   the fused layers' GEMMs accumulate with beta 1, as their hand-written backward did.
// - Hooks. A node's arrival hooks run when the first gradient for it arrives; its pre-hooks
//   run before its backward with the gradients it received and may replace them; its
//   post-hooks run after it. Callbacks queued during a Backward
//   (QueueBackwardCallback) run after the last node, in queue order: where FSDP's hooks
//   ride (NOTE [Root unit] in fsdp/runtime.h).
// - Cost. Recording an op is a few allocations (the node, its edges, its saved handles);
//   nn/functional's autograd_bench prints the bookkeeping per op of a long chain.
// - Threads. Graphs are per thread: a graph is built and run on one thread, and two
//   threads never share a node (each rank of a thread-per-rank test has its own model).
#ifndef CORE_AUTOGRAD_H_
#define CORE_AUTOGRAD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/parameter.h"
#include "core/tensor.h"

namespace core {

// False while a NoGradScope is open on this thread: no op records a node or saves a tensor,
// and modules run as forward-only passes (NOTE [Activation checkpointing] in module.h).
bool GradEnabled();

// Turns grad mode off on this thread while it lives. Nestable.
class NoGradScope {
 public:
  NoGradScope();
  ~NoGradScope();
  NoGradScope(const NoGradScope&) = delete;
  NoGradScope& operator=(const NoGradScope&) = delete;

 private:
  bool previous_;
};

// Turns grad mode on on this thread while it lives (inside a backward, where it is off: a
// checkpointed module's recompute). Nestable.
class EnableGradScope {
 public:
  EnableGradScope();
  ~EnableGradScope();
  EnableGradScope(const EnableGradScope&) = delete;
  EnableGradScope& operator=(const EnableGradScope&) = delete;

 private:
  bool previous_;
};

class Node;
struct Bf16GradCopy;

// Where a gradient goes: gradient input `input_nr` of `node` (the node's output of that
// index in the forward). A null node: the tensor needs no gradient.
struct Edge {
  std::shared_ptr<Node> node;
  int input_nr = 0;
};

// A tensor's place in the graph (NOTE [Autograd]).
class AutogradMeta {
 public:
  AutogradMeta(std::shared_ptr<Node> node, int output_nr, bool leaf)
      : node(std::move(node)), output_nr(output_nr), leaf(leaf) {}
  // The producing op's node, or a leaf's accumulator.
  std::shared_ptr<Node> node;
  int output_nr = 0;
  bool leaf = false;
  // Set for a parameter's leaf record: saved by reference (SavedTensor).
  std::weak_ptr<Parameter> parameter;
};

// One recorded op: its backward and the edges to its inputs' nodes. Subclass it for an op
// whose backward is a class of its own; RecordFunction covers the common case.
class Node {
 public:
  virtual ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // The op's name for messages: "MatMul", "Linear", "AccumulateGrad".
  virtual std::string name() const = 0;

  // The gradients of the op's inputs (one per next edge; undefined: none) from those of its
  // outputs (`grads`, one per output, each defined: zeros where none arrived).
  virtual absl::StatusOr<std::vector<Tensor>> Apply(std::vector<Tensor> grads) = 0;

  // Frees what the node saved for Apply; called after it ran.
  virtual void ReleaseSaved() {}
  // The first saved tensor's name ("" when none), for the freed-graph error.
  virtual std::string FirstSavedName() const { return ""; }
  // True for nodes that outlive a backward (leaf accumulators): never freed.
  virtual bool reusable() const { return false; }
  // False for nodes whose Apply takes undefined gradients for outputs that received none
  // (and passes undefined ones on: identity nodes); true (the default) gets zeros there.
  virtual bool materializes_grads() const { return true; }
  // True where Apply takes output `i`'s gradient in bf16 as a producer passed it (NOTE
  // [Autograd]); false (the default): always fp32.
  virtual bool takes_bf16_grad(int i) const { return false; }
  // Output `i`'s NOTE [bf16 gradient copies] box; null (the default): none.
  virtual std::shared_ptr<Bf16GradCopy> bf16_grad_copy(int i) const { return nullptr; }

  int num_outputs() const { return static_cast<int>(outputs_.size()); }
  const std::vector<Edge>& next_edges() const { return next_edges_; }
  uint64_t sequence_nr() const { return sequence_nr_; }

  // Runs before Apply with the gradients that arrived (zeros filled in); may change them.
  using PreHook = std::function<absl::Status(std::vector<Tensor>& grads)>;
  // Runs after Apply.
  using PostHook = std::function<absl::Status()>;
  void AddPreHook(PreHook hook) { pre_hooks_.push_back(std::move(hook)); }
  void AddPostHook(PostHook hook) { post_hooks_.push_back(std::move(hook)); }
  // Runs when the first gradient for any output of the node arrives in a Backward (before
  // the other consumers of its outputs have delivered theirs).
  void AddArrivalHook(PostHook hook) { arrival_hooks_.push_back(std::move(hook)); }

 protected:
  // `outputs`: the op's outputs (their shapes and devices: zero gradients are made from
  // them); `inputs`: the op's inputs, whose records give the next edges.
  Node(absl::Span<const Tensor> outputs, absl::Span<const Tensor> inputs);
  // A leaf's node: one output of `like`'s shape, no next edges.
  explicit Node(const Tensor& like);

 private:
  friend class GraphRun;
  struct OutputInfo {
    Shape shape;
    Device device;
  };
  std::vector<Edge> next_edges_;
  std::vector<OutputInfo> outputs_;
  uint64_t sequence_nr_ = 0;
  std::vector<PreHook> pre_hooks_;
  std::vector<PostHook> post_hooks_;
  std::vector<PostHook> arrival_hooks_;
  // Engine state during one Backward.
  uint64_t run_id_ = 0;
  int dependencies_ = 0;
  bool arrived_ = false;
  std::vector<Tensor> buffer_;
  bool freed_ = false;
};

// A saved tensor (NOTE [Autograd]).
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  // `t` as it is now, or FailedPrecondition "<op>: saved tensor '<name>' ..." when its
  // storage was written in place since it was saved, when it was freed, or when a saved
  // parameter's data changed shape or dtype.
  absl::StatusOr<Tensor> Unpack(absl::string_view op, absl::string_view name) const;
  void Reset();

 private:
  Tensor data_;
  ParameterPtr parameter_;  // a parameter leaf, read at Unpack
  Shape shape_;
  DType dtype_ = DType::kFloat32;
  uint64_t version_ = 0;
  bool saved_ = false;
  bool freed_ = false;
};

// True when `t` carries a record: some backward can reach it.
bool RequiresGrad(const Tensor& t);
// True when GradEnabled() and some tensor of `inputs` requires gradients: an op records.
bool AnyRequiresGrad(absl::Span<const Tensor> inputs);

// The same storage, shape and dtype without a record.
Tensor Detach(const Tensor& t);

// A handle to `t`'s data that is a leaf requiring gradients (a new record: other handles
// of `t` are unaffected). Backward adds the gradients reaching it into its LeafGrad.
Tensor Leaf(const Tensor& t);
// The gradient accumulated at leaf `t` (undefined before any reached it).
Tensor LeafGrad(const Tensor& t);
// p->data with the parameter's leaf record (made on first use and shared by every use), so
// ops on it send their gradients into p->grad; p->data alone (no record) when
// !p->requires_grad.
Tensor Value(const ParameterPtr& p);

// An op's tensor argument: a tensor, a parameter (its Value) or the result of an earlier op.
// An op given an error returns it unchanged, so a forward composes fallible ops as
//   absl::StatusOr<Tensor> y = F::Linear(F::Gelu(F::Linear(x, w1, b1)), w2, b2);
// and checks once: the first failure, naming its op, is what y holds (XlaBuilder's way).
class Arg {
 public:
  Arg(const Tensor& t) : tensor_(t) {}   // NOLINT
  Arg(const ParameterPtr& p);            // NOLINT
  Arg(const absl::StatusOr<Tensor>& t);  // NOLINT
  const absl::Status& status() const { return status_; }
  bool ok() const { return status_.ok(); }
  // The tensor (undefined when !ok()).
  const Tensor& tensor() const { return tensor_; }

 private:
  Tensor tensor_;
  absl::Status status_;
};

// What a RecordFunction backward gets.
class BackwardContext {
 public:
  BackwardContext(const std::vector<Tensor>* grads, const std::vector<Tensor>* saved,
                  const std::vector<Edge>* edges)
      : grads_(grads), saved_(saved), edges_(edges) {}
  // The gradient of output `i` (zeros where none arrived): fp32, or bf16 for an output
  // RecordFunction's FunctionOptions::bf16_grad_outputs lists, when it arrived so.
  const Tensor& grad(int i) const { return (*grads_)[i]; }
  // Saved tensor `i`, as RecordFunction's `saved` listed it (checked: NOTE [Autograd]).
  const Tensor& saved(int i) const { return (*saved_)[i]; }
  // True when input `i`'s gradient goes anywhere; a backward may skip the others (return
  // an undefined tensor for them).
  bool needs_grad(int i) const;
  // The parameter when input `i` is a parameter leaf, else null. The backward may add the
  // input's gradient into its `grad` itself (after EnsureGrad) and return an undefined
  // tensor for it; the gradient is final when the parameter's accumulator runs.
  ParameterPtr parameter(int i) const;

 private:
  const std::vector<Tensor>* grads_;
  const std::vector<Tensor>* saved_;
  const std::vector<Edge>* edges_;
};

// One gradient per input (undefined: none).
using BackwardFn = std::function<absl::StatusOr<std::vector<Tensor>>(const BackwardContext&)>;

// NOTE [bf16 gradient copies]: an op whose backward rounds the fp32 gradient of its output to
// bf16 for its GEMMs (and also needs the fp32 one) may offer this box
// (FunctionOptions::bf16_grad_copy); the consumer of that output, whose backward computes the
// gradient in a pass of its own, may write the bf16 copy in the same pass and leave both here
// (ProducerBf16GradCopy at its forward). The producer takes the copy only when the gradient it
// received is that very tensor (the consumer was the only one: a sum is a new tensor), so the
// bits are those of rounding it itself, one pass fewer.
struct Bf16GradCopy {
  Tensor sent;  // the fp32 gradient the consumer passed
  Tensor copy;  // its bf16 copy
};

// The box output `t`'s producer offers (null when none, or `t` is a leaf or has no record).
std::shared_ptr<Bf16GradCopy> ProducerBf16GradCopy(const Tensor& t);
// The bf16 copy of `grad` from `box` when the consumer left one for this very tensor, else
// undefined; empties the box either way.
Tensor TakeBf16GradCopy(const std::shared_ptr<Bf16GradCopy>& box, const Tensor& grad);

// A custom function's record (torch.autograd.Function): when AnyRequiresGrad(inputs),
// makes a node named `name` over `inputs`, saving `saved` (named `saved_names[i]` in errors,
// "saved i" where absent) for `backward`, and points every output's record at it (output i
// of the node). Otherwise does nothing. Outputs must be defined tensors the op just made.
// InvalidArgument naming `name` for an undefined output.
// How a custom function takes its gradients.
struct FunctionOptions {
  // The outputs whose gradient the backward takes in bf16 when a producer passes it so
  // (Node::takes_bf16_grad); the others always arrive fp32.
  std::vector<int> bf16_grad_outputs;
  // Output 0's NOTE [bf16 gradient copies] box, for its consumer; null: none.
  std::shared_ptr<Bf16GradCopy> bf16_grad_copy;
};

absl::Status RecordFunction(std::string name, absl::Span<const Tensor> inputs,
                            absl::Span<Tensor* const> outputs, std::vector<Tensor> saved,
                            BackwardFn backward, std::vector<std::string> saved_names = {},
                            const FunctionOptions& options = {});

struct BackwardOptions {
  // Keep the nodes' saved tensors, so another Backward may run through the same graph.
  bool retain_graph = false;
};

// Runs the graph behind `outputs` in reverse, seeding output i with `grads[i]` (its shape,
// fp32; numel-1 outputs may pass an undefined grad, meaning 1). Leaves' gradients
// accumulate (Parameter::grad, LeafGrad). InvalidArgument for an output without a record or
// a seed of the wrong size; a node's failure is returned prefixed "backward of '<op>': "
// and leaves no gradient buffered in the graph.
absl::Status Backward(absl::Span<const Tensor> outputs, absl::Span<const Tensor> grads,
                      BackwardOptions options = {});
// Backward of a one-element tensor (a loss) with seed 1.
absl::Status Backward(const Tensor& loss, BackwardOptions options = {});

// True when `t` is the seed 1 a running Backward on this thread made for an output given no
// gradient (Backward(loss)), as it reaches that output's node (nothing added to it): a custom
// function whose backward multiplies a kept gradient by its output's gradient may then return
// the kept one as it is (the same bits, one pass fewer; F::CrossEntropy does).
bool IsUnitSeed(const Tensor& t);

// Where a queued callback runs among those not yet started.
enum class CallbackOrder {
  kAfterEarlier,   // after them: queue order
  kBeforeEarlier,  // before them: a stack (the callback queued last runs first)
};

// Queues `callback` to run after the running Backward's last node, in `order` (the first
// error is Backward's). A module whose inputs take no gradient queues its backward post-hooks
// kBeforeEarlier when its outputs' first gradient arrives (NOTE [Graph modules] in
// core/module.h): outer modules' gradients arrive first, so inner modules' hooks run first, as
// they do where the inputs take gradients. FailedPrecondition outside a Backward on this thread.
absl::Status QueueBackwardCallback(std::function<absl::Status()> callback,
                                   CallbackOrder order = CallbackOrder::kAfterEarlier);
// True while a Backward runs on this thread.
bool InBackward();

// dst += src, elementwise, both fp32 of equal numel on one device (CPU, or CUDA in a CUDA
// build: a kernel on the compute stream). The engine's gradient sum; bumps dst's version.
absl::Status AddInto(const Tensor& dst, const Tensor& src);

}  // namespace core

#endif  // CORE_AUTOGRAD_H_
