#include "core/autograd.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/status_macros.h"

#ifdef FSDP_WITH_CUDA
#include "core/cuda/kernels.h"
#include "core/cuda_status.h"
#endif

namespace core {
namespace {

thread_local bool grad_enabled = true;

// NOTE [Autograd]: one counter for the process, so a node made on any thread numbers above
// every node made before it (a parameter's accumulator may be made on another thread).
std::atomic<uint64_t> next_sequence_nr{1};
std::atomic<uint64_t> next_run_id{1};

Edge EdgeOf(const Tensor& t) {
  const std::shared_ptr<AutogradMeta>& meta = t.autograd_meta();
  if (meta == nullptr || meta->node == nullptr) return Edge{};
  return Edge{meta->node, meta->output_nr};
}

// The node of a leaf: adds what reaches it into a parameter's grad or into its own
// gradient (Leaf).
class AccumulateGrad : public Node {
 public:
  AccumulateGrad(const Tensor& like, std::weak_ptr<Parameter> parameter)
      : Node(like), parameter_(std::move(parameter)), is_parameter_(!parameter_.expired()) {}

  std::string name() const override { return "AccumulateGrad"; }
  bool reusable() const override { return true; }

  absl::StatusOr<std::vector<Tensor>> Apply(std::vector<Tensor> grads) override {
    const Tensor& g = grads[0];
    if (is_parameter_) {
      std::shared_ptr<Parameter> p = parameter_.lock();
      if (p == nullptr) return std::vector<Tensor>{};  // the parameter is gone
      if (!p->grad.defined()) {
        // Gradients are fp32, also of bf16 data.
        absl::StatusOr<Tensor> copy = g.To(g.device(), MemoryTag::kGrad);
        if (!copy.ok()) return copy.status();
        absl::StatusOr<Tensor> shaped = copy->Reshape(p->data.shape());
        if (!shaped.ok()) return shaped.status();
        p->grad = *std::move(shaped);
        return std::vector<Tensor>{};
      }
      if (absl::Status s = AddInto(p->grad, g); !s.ok()) {
        return Annotate(s, absl::StrCat("parameter ", p->data.ToString()));
      }
      return std::vector<Tensor>{};
    }
    if (!grad_.defined() && g.dtype() == DType::kFloat32 && g.storage() != nullptr &&
        g.storage().use_count() == 1) {
      grad_ = std::move(grads[0]);  // nothing else holds it: keep it without a copy
    } else if (!grad_.defined()) {
      absl::StatusOr<Tensor> copy = g.To(g.device(), MemoryTag::kGrad);
      if (!copy.ok()) return copy.status();
      grad_ = *std::move(copy);
    } else if (absl::Status s = AddInto(grad_, g); !s.ok()) {
      return s;
    }
    return std::vector<Tensor>{};
  }

  // The parameter it accumulates into, while it lives; null for a plain leaf.
  ParameterPtr parameter() const { return parameter_.lock(); }

  Tensor grad_;

 private:
  std::weak_ptr<Parameter> parameter_;
  bool is_parameter_;
};

// RecordFunction's node.
class FunctionNode : public Node {
 public:
  FunctionNode(std::string name, absl::Span<const Tensor> outputs, absl::Span<const Tensor> inputs,
               std::vector<Tensor> saved, std::vector<std::string> saved_names, BackwardFn backward,
               std::vector<int> bf16_grad_outputs, std::shared_ptr<Bf16GradCopy> bf16_grad_copy)
      : Node(outputs, inputs),
        name_(std::move(name)),
        saved_names_(std::move(saved_names)),
        backward_(std::move(backward)),
        bf16_grad_outputs_(std::move(bf16_grad_outputs)),
        bf16_grad_copy_(std::move(bf16_grad_copy)) {
    saved_.reserve(saved.size());
    for (const Tensor& t : saved) saved_.emplace_back(t);
  }

  std::string name() const override { return name_; }
  bool takes_bf16_grad(int i) const override {
    return std::find(bf16_grad_outputs_.begin(), bf16_grad_outputs_.end(), i) !=
           bf16_grad_outputs_.end();
  }
  std::shared_ptr<Bf16GradCopy> bf16_grad_copy(int i) const override {
    return i == 0 ? bf16_grad_copy_ : nullptr;
  }

  absl::StatusOr<std::vector<Tensor>> Apply(std::vector<Tensor> grads) override {
    std::vector<Tensor> unpacked;
    unpacked.reserve(saved_.size());
    for (size_t i = 0; i < saved_.size(); ++i) {
      absl::StatusOr<Tensor> t = saved_[i].Unpack(name_, SavedName(i));
      if (!t.ok()) return t.status();
      unpacked.push_back(*std::move(t));
    }
    BackwardContext ctx(&grads, &unpacked, &next_edges());
    absl::StatusOr<std::vector<Tensor>> out = backward_(ctx);
    if (!out.ok()) return out.status();
    if (out->size() != next_edges().size()) {
      return absl::InternalError(absl::StrCat(name_, ": its backward returned ", out->size(),
                                              " gradients for ", next_edges().size(), " inputs"));
    }
    return out;
  }

  void ReleaseSaved() override {
    for (SavedTensor& s : saved_) s.Reset();
    backward_ = nullptr;
  }
  std::string FirstSavedName() const override { return saved_.empty() ? "" : SavedName(0); }

 private:
  std::string SavedName(size_t i) const {
    return i < saved_names_.size() ? saved_names_[i] : absl::StrCat("saved ", i);
  }

  std::string name_;
  std::vector<SavedTensor> saved_;
  std::vector<std::string> saved_names_;
  BackwardFn backward_;
  std::vector<int> bf16_grad_outputs_;
  std::shared_ptr<Bf16GradCopy> bf16_grad_copy_;
};

struct ByHighestSequence {
  bool operator()(const Node* a, const Node* b) const {
    return a->sequence_nr() < b->sequence_nr();
  }
};

// The running Backward's callbacks, run by index from `next` (QueueBackwardCallback).
struct CallbackQueue {
  std::vector<std::function<absl::Status()>> items;
  size_t next = 0;
};
thread_local CallbackQueue* running_callbacks = nullptr;
// The runs in progress on this thread, outermost first (a Backward inside a node's backward:
// a checkpointed module's recompute).
thread_local std::vector<uint64_t> active_runs;
// The storage of the implicit seeds (1) of the Backwards running on this thread (IsUnitSeed).
thread_local std::vector<const void*> unit_seeds;

absl::Status ZerosLike(const Shape& shape, Device device, Tensor* out) {
  absl::StatusOr<Tensor> z =
      Tensor::Allocate(shape, DType::kFloat32, MemoryTag::kActivation, device);
  if (!z.ok()) return z.status();
  RETURN_IF_ERROR(z->TryZero());
  *out = *std::move(z);
  return absl::OkStatus();
}

}  // namespace

bool GradEnabled() { return grad_enabled; }
NoGradScope::NoGradScope() : previous_(grad_enabled) { grad_enabled = false; }
NoGradScope::~NoGradScope() { grad_enabled = previous_; }
EnableGradScope::EnableGradScope() : previous_(grad_enabled) { grad_enabled = true; }
EnableGradScope::~EnableGradScope() { grad_enabled = previous_; }

Node::Node(absl::Span<const Tensor> outputs, absl::Span<const Tensor> inputs)
    : sequence_nr_(next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {
  next_edges_.reserve(inputs.size());
  for (const Tensor& t : inputs) next_edges_.push_back(EdgeOf(t));
  outputs_.reserve(outputs.size());
  for (const Tensor& t : outputs) outputs_.push_back(OutputInfo{t.shape(), t.device()});
}

// A leaf's accumulator outranks every op (NOTE [Autograd]): it runs as soon as its last
// consumer delivered, so a gradient is in Parameter::grad (and FSDP can reduce it) without
// waiting for the rest of the backward.
Node::Node(const Tensor& like)
    : outputs_{OutputInfo{like.shape(), like.device()}},
      sequence_nr_(std::numeric_limits<uint64_t>::max()) {}

// Frees the producers this node was the last owner of iteratively: a long graph dropped at
// once would otherwise recurse one frame per node and overflow the stack.
Node::~Node() {
  std::vector<std::shared_ptr<Node>> owned;
  const auto take = [&owned](std::vector<Edge>& edges) {
    for (Edge& e : edges) {
      if (e.node != nullptr && e.node.use_count() == 1) owned.push_back(std::move(e.node));
    }
  };
  take(next_edges_);
  while (!owned.empty()) {
    std::shared_ptr<Node> n = std::move(owned.back());
    owned.pop_back();
    take(n->next_edges_);
  }  // each `n` dies with no edge it owns alone: no recursion
}

// ---- SavedTensor

SavedTensor::SavedTensor(const Tensor& t)
    : shape_(t.shape()), dtype_(t.dtype()), version_(t.version()), saved_(true) {
  const std::shared_ptr<AutogradMeta>& meta = t.autograd_meta();
  if (meta != nullptr && meta->leaf && !meta->parameter.expired()) {
    parameter_ = meta->parameter.lock();  // by reference: NOTE [Autograd]
  } else {
    data_ = Detach(t);
  }
}

absl::StatusOr<Tensor> SavedTensor::Unpack(absl::string_view op, absl::string_view name) const {
  if (freed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        op, ": saved tensor '", name,
        "' was freed by an earlier backward; run the forward again (or keep the graph with "
        "BackwardOptions::retain_graph)"));
  }
  if (!saved_) return Tensor();
  if (parameter_ != nullptr) {
    const ParameterPtr& p = parameter_;
    if (p->data.shape() != shape_ || p->data.dtype() != dtype_) {
      return absl::FailedPreconditionError(
          absl::StrCat(op, ": saved parameter '", name, "' was ", ShapeToString(shape_), " ",
                       DTypeName(dtype_), " in the forward and is ", p->data.ToString(),
                       " in the backward (resharded and not gathered again?)"));
    }
    return p->data;
  }
  if (data_.version() != version_) {
    return absl::FailedPreconditionError(absl::StrCat(
        op, ": saved tensor '", name, "' (", data_.ToString(),
        ") was modified in place after the forward saved it (version ", version_, ", now ",
        data_.version(), "); clone it before writing, or write before the op"));
  }
  return data_;
}

void SavedTensor::Reset() {
  data_ = Tensor();
  parameter_.reset();
  freed_ = saved_;
}

// ---- records

bool RequiresGrad(const Tensor& t) {
  const std::shared_ptr<AutogradMeta>& meta = t.autograd_meta();
  return meta != nullptr && meta->node != nullptr;
}

bool AnyRequiresGrad(absl::Span<const Tensor> inputs) {
  if (!grad_enabled) return false;
  for (const Tensor& t : inputs) {
    if (RequiresGrad(t)) return true;
  }
  return false;
}

Tensor Detach(const Tensor& t) {
  Tensor out = t;
  out.set_autograd_meta(nullptr);
  return out;
}

Tensor Leaf(const Tensor& t) {
  Tensor out = t;
  out.set_autograd_meta(std::make_shared<AutogradMeta>(
      std::make_shared<AccumulateGrad>(t, std::weak_ptr<Parameter>()), 0, true));
  return out;
}

namespace {
AccumulateGrad* LeafNode(const Tensor& t) {
  const std::shared_ptr<AutogradMeta>& meta = t.autograd_meta();
  if (meta == nullptr || !meta->leaf) return nullptr;
  return static_cast<AccumulateGrad*>(meta->node.get());
}
}  // namespace

Tensor LeafGrad(const Tensor& t) {
  AccumulateGrad* node = LeafNode(t);
  return node == nullptr ? Tensor() : node->grad_;
}

Tensor Value(const ParameterPtr& p) {
  Tensor out = p->data;
  if (!p->requires_grad) {
    out.set_autograd_meta(nullptr);
    return out;
  }
  if (p->autograd == nullptr) {
    p->autograd =
        std::make_shared<AutogradMeta>(std::make_shared<AccumulateGrad>(p->data, p), 0, true);
    p->autograd->parameter = p;
  }
  out.set_autograd_meta(p->autograd);
  return out;
}

Arg::Arg(const ParameterPtr& p) {
  if (p == nullptr) {
    status_ = absl::InvalidArgumentError("a null ParameterPtr was passed to an op");
    return;
  }
  if (p->deferred()) {
    status_ = absl::FailedPreconditionError(absl::StrCat(
        "parameter ", p->data.ToString(),
        " is deferred and not materialized yet (NOTE [Deferred initialisation] in "
        "core/param_init.h): materialize it, or wrap the model with fsdp::FullyShard, before "
        "running it"));
    return;
  }
  tensor_ = Value(p);
}

Arg::Arg(const absl::StatusOr<Tensor>& t) {
  if (t.ok()) {
    tensor_ = *t;
  } else {
    status_ = t.status();
  }
}

bool BackwardContext::needs_grad(int i) const { return (*edges_)[i].node != nullptr; }

ParameterPtr BackwardContext::parameter(int i) const {
  const Edge& e = (*edges_)[i];
  if (e.node == nullptr || !e.node->reusable()) return nullptr;
  const auto* leaf = dynamic_cast<const AccumulateGrad*>(e.node.get());
  return leaf == nullptr ? nullptr : leaf->parameter();
}

absl::Status RecordFunction(std::string name, absl::Span<const Tensor> inputs,
                            absl::Span<Tensor* const> outputs, std::vector<Tensor> saved,
                            BackwardFn backward, std::vector<std::string> saved_names,
                            const FunctionOptions& options) {
  if (!AnyRequiresGrad(inputs)) return absl::OkStatus();
  std::vector<Tensor> outs;
  outs.reserve(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i] == nullptr || !outputs[i]->defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": output ", i, " is undefined; an op records defined outputs"));
    }
    outs.push_back(*outputs[i]);
  }
  auto node = std::make_shared<FunctionNode>(std::move(name), outs, inputs, std::move(saved),
                                             std::move(saved_names), std::move(backward),
                                             options.bf16_grad_outputs, options.bf16_grad_copy);
  for (size_t i = 0; i < outputs.size(); ++i) {
    outputs[i]->set_autograd_meta(std::make_shared<AutogradMeta>(node, static_cast<int>(i), false));
  }
  return absl::OkStatus();
}

std::shared_ptr<Bf16GradCopy> ProducerBf16GradCopy(const Tensor& t) {
  const std::shared_ptr<AutogradMeta>& meta = t.autograd_meta();
  if (meta == nullptr || meta->leaf || meta->node == nullptr) return nullptr;
  return meta->node->bf16_grad_copy(meta->output_nr);
}

Tensor TakeBf16GradCopy(const std::shared_ptr<Bf16GradCopy>& box, const Tensor& grad) {
  if (box == nullptr) return Tensor();
  Tensor copy;
  if (box->sent.defined() && grad.defined() && box->sent.storage() == grad.storage() &&
      box->copy.numel() == grad.numel()) {
    copy = std::move(box->copy);
  }
  box->sent = Tensor();
  box->copy = Tensor();
  return copy;
}

// ---- the engine

namespace {

// out = a + b elementwise (out may be a).
absl::Status AddTensors(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (a.dtype() != DType::kFloat32 || b.dtype() != DType::kFloat32 ||
      out.dtype() != DType::kFloat32 || a.numel() != b.numel() || a.numel() != out.numel() ||
      a.device() != b.device() || a.device() != out.device() || !a.defined() || !b.defined() ||
      !out.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient sum needs defined fp32 tensors of equal numel on one device, got ",
                     a.ToString(), " + ", b.ToString(), " -> ", out.ToString()));
  }
  out.storage()->BumpVersion();
  const int64_t n = a.numel();
  if (n == 0) return absl::OkStatus();
  ProfiledOp op(OpCategory::kElementwise, "grad.add", out.device(),
                OpCost::Memory(3.0 * static_cast<double>(out.nbytes())));
  if (out.device().is_cpu()) {
    const float* pa = a.data<float>();
    const float* pb = b.data<float>();
    float* po = out.data<float>();
    for (int64_t i = 0; i < n; ++i) po[i] = pa[i] + pb[i];
    return absl::OkStatus();
  }
#ifdef FSDP_WITH_CUDA
  RETURN_IF_ERROR(cuda::SetDevice(out.device()));
  return cuda::Add(a.data<float>(), b.data<float>(), out.data<float>(), n);
#else
  return absl::UnavailableError(
      absl::StrCat("gradient sum on ", out.ToString(), ": this build has no CUDA support"));
#endif
}

}  // namespace

absl::Status AddInto(const Tensor& dst, const Tensor& src) { return AddTensors(dst, src, dst); }

// One Backward (NOTE [Autograd]): finds the nodes the roots reach, counts their incoming
// edges, then runs the ready node with the highest sequence number until none is left.
class GraphRun {
 public:
  explicit GraphRun(const BackwardOptions& options)
      : options_(options), run_id_(next_run_id.fetch_add(1, std::memory_order_relaxed)) {
    active_runs.push_back(run_id_);
  }

  ~GraphRun() {
    for (Node* n : visited_) n->buffer_.clear();
    // A node an enclosing run is still counting (a parameter's accumulator reached again by a
    // checkpointed module's recompute) gets that run's state back.
    for (Stashed& s : stashed_) {
      s.node->run_id_ = s.run_id;
      s.node->dependencies_ = s.dependencies;
      s.node->arrived_ = s.arrived;
      s.node->buffer_ = std::move(s.buffer);
    }
    active_runs.pop_back();
  }

  absl::Status Run(absl::Span<const Edge> roots, absl::Span<const Tensor> seeds) {
    for (const Edge& e : roots) Visit(e.node.get());
    // A freed node reached again: name one that saved a tensor where there is one.
    Node* freed = nullptr;
    for (size_t i = 0; i < stack_.size(); ++i) {
      Node* n = stack_[i];
      if (n->freed_ && (freed == nullptr || freed->FirstSavedName().empty())) freed = n;
      for (const Edge& e : n->next_edges_) {
        if (e.node == nullptr) continue;
        Visit(e.node.get());
        ++e.node->dependencies_;
      }
    }
    if (freed != nullptr) {
      const std::string saved = freed->FirstSavedName();
      return absl::FailedPreconditionError(
          absl::StrCat("Backward: the graph through '", freed->name(), "'",
                       saved.empty() ? "" : absl::StrCat(" (saved tensor '", saved, "')"),
                       " was freed by an earlier backward; run the forward again, or pass "
                       "BackwardOptions::retain_graph to the first backward"));
    }
    for (size_t i = 0; i < roots.size(); ++i) {
      RETURN_IF_ERROR(Deliver("Backward", roots[i], seeds[i]));
    }
    for (Node* n : visited_) {
      if (n->dependencies_ == 0) ready_.push(n);
    }
    CallbackQueue callbacks;
    CallbackQueue* outer = running_callbacks;
    running_callbacks = &callbacks;
    absl::Status status = Drain();
    // Callbacks may queue more callbacks (the vector may grow or move): run by index, each
    // moved out before it runs.
    while (status.ok() && callbacks.next < callbacks.items.size()) {
      std::function<absl::Status()> callback = std::move(callbacks.items[callbacks.next++]);
      status = callback();
    }
    running_callbacks = outer;
    return status;
  }

 private:
  void Visit(Node* n) {
    if (n->run_id_ == run_id_) return;
    if (std::find(active_runs.begin(), active_runs.end(), n->run_id_) != active_runs.end()) {
      stashed_.push_back(
          Stashed{n, n->run_id_, n->dependencies_, n->arrived_, std::move(n->buffer_)});
    }
    n->run_id_ = run_id_;
    n->dependencies_ = 0;
    n->arrived_ = false;
    n->buffer_.assign(n->outputs_.size(), Tensor());
    visited_.push_back(n);
    stack_.push_back(n);
  }

  absl::Status Drain() {
    while (!ready_.empty()) {
      Node* n = ready_.top();
      ready_.pop();
      absl::StatusOr<std::vector<Tensor>> grads = RunNode(n);
      if (!grads.ok()) {
        return Annotate(grads.status(), absl::StrCat("backward of '", n->name(), "'"));
      }
      for (size_t i = 0; i < n->next_edges_.size(); ++i) {
        const Edge& e = n->next_edges_[i];
        if (e.node == nullptr) continue;
        if (i < grads->size() && (*grads)[i].defined()) {
          RETURN_IF_ERROR(Deliver(n->name(), e, (*grads)[i]));
        }
        if (--e.node->dependencies_ == 0) ready_.push(e.node.get());
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<Tensor>> RunNode(Node* n) {
    std::vector<Tensor> grads = std::move(n->buffer_);
    n->buffer_.clear();
    bool any = false;
    for (const Tensor& g : grads) any = any || g.defined();
    std::vector<Tensor> out;
    if (any) {
      for (size_t i = 0; i < grads.size() && n->materializes_grads(); ++i) {
        if (grads[i].defined()) continue;
        if (absl::Status s = ZerosLike(n->outputs_[i].shape, n->outputs_[i].device, &grads[i]);
            !s.ok()) {
          return s;
        }
      }
      for (Node::PreHook& hook : n->pre_hooks_) {
        RETURN_IF_ERROR(hook(grads));
      }
      {
        NoGradScope no_grad;
        absl::StatusOr<std::vector<Tensor>> applied = n->Apply(std::move(grads));
        if (!applied.ok()) return applied.status();
        out = *std::move(applied);
      }
      for (Node::PostHook& hook : n->post_hooks_) {
        RETURN_IF_ERROR(hook());
      }
    }
    if (!options_.retain_graph && !n->reusable()) {
      n->ReleaseSaved();
      n->freed_ = true;
    }
    return out;
  }

  // Adds `g`, which `from` produced, into the gradient buffer of `e`.
  absl::Status Deliver(absl::string_view from, const Edge& e, const Tensor& given) {
    const Node::OutputInfo& info = e.node->outputs_[e.input_nr];
    if ((given.dtype() != DType::kFloat32 && given.dtype() != DType::kBFloat16) ||
        given.numel() != NumElements(info.shape) || given.device() != info.device) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", from, "' passed a gradient ", given.ToString(), " to '", e.node->name(),
                       "', whose tensor is ", ShapeToString(info.shape), " float32 or bfloat16 on ",
                       info.device.ToString()));
    }
    if (!e.node->arrived_) {
      e.node->arrived_ = true;
      for (Node::PostHook& hook : e.node->arrival_hooks_) {
        RETURN_IF_ERROR(hook());
      }
    }
    Tensor& slot = e.node->buffer_[e.input_nr];
    Tensor g = Detach(given);
    // NOTE [Autograd]: a bf16 gradient stays so only as the sole gradient of a tensor whose
    // node takes it; otherwise it is widened (exactly) first.
    const bool keep_bf16 = !slot.defined() && e.node->takes_bf16_grad(e.input_nr);
    if (g.dtype() == DType::kBFloat16 && !keep_bf16) {
      absl::StatusOr<Tensor> wide = g.ToDType(DType::kFloat32, MemoryTag::kActivation);
      if (!wide.ok()) return wide.status();
      g = *std::move(wide);
    }
    if (!slot.defined()) {
      slot = std::move(g);
      return absl::OkStatus();
    }
    if (slot.dtype() == DType::kBFloat16) {
      absl::StatusOr<Tensor> wide = slot.ToDType(DType::kFloat32, MemoryTag::kActivation);
      if (!wide.ok()) return wide.status();
      slot = *std::move(wide);
    }
    // A fresh sum: `slot` may be a tensor another node also received.
    absl::StatusOr<Tensor> sum =
        Tensor::Allocate(slot.shape(), DType::kFloat32, MemoryTag::kActivation, g.device());
    if (!sum.ok()) return sum.status();
    RETURN_IF_ERROR(AddTensors(slot, g, *sum));
    slot = *std::move(sum);
    return absl::OkStatus();
  }

  // An enclosing run's state of a node this run also reaches.
  struct Stashed {
    Node* node;
    uint64_t run_id;
    int dependencies;
    bool arrived;
    std::vector<Tensor> buffer;
  };

  BackwardOptions options_;
  uint64_t run_id_;
  std::vector<Stashed> stashed_;
  std::vector<Node*> visited_;
  std::vector<Node*> stack_;
  std::priority_queue<Node*, std::vector<Node*>, ByHighestSequence> ready_;
};

absl::Status Backward(absl::Span<const Tensor> outputs, absl::Span<const Tensor> grads,
                      BackwardOptions options) {
  if (outputs.size() != grads.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Backward: ", outputs.size(), " outputs but ", grads.size(), " gradients"));
  }
  std::vector<Edge> roots;
  std::vector<Tensor> seeds;
  // The implicit seeds this call makes are IsUnitSeed until it returns.
  struct UnitSeedsScope {
    size_t before = unit_seeds.size();
    ~UnitSeedsScope() { unit_seeds.resize(before); }
  } unit_seeds_scope;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    Edge e = EdgeOf(out);
    if (e.node == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Backward: output ", i, " (", out.ToString(),
          ") has no autograd record: no tensor it was computed from requires gradients, or "
          "it was computed under NoGradScope or detached"));
    }
    Tensor seed = grads[i];
    if (!seed.defined()) {
      if (out.numel() != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("Backward: output ", i, " (", out.ToString(),
                         ") has more than one element, so it needs a gradient"));
      }
      absl::StatusOr<Tensor> one =
          Tensor::Allocate(out.shape(), DType::kFloat32, MemoryTag::kActivation, out.device());
      if (!one.ok()) return one.status();
      RETURN_IF_ERROR(one->TryFill(1.0f));
      seed = *std::move(one);
      unit_seeds.push_back(seed.raw_data());
    }
    roots.push_back(std::move(e));
    seeds.push_back(std::move(seed));
  }
  GraphRun run(options);
  return run.Run(roots, seeds);
}

bool IsUnitSeed(const Tensor& t) {
  if (!t.defined() || t.numel() != 1 || t.dtype() != DType::kFloat32) return false;
  const void* data = t.raw_data();
  for (const void* seed : unit_seeds) {
    if (seed == data) return true;
  }
  return false;
}

absl::Status Backward(const Tensor& loss, BackwardOptions options) {
  const Tensor none;
  return Backward(absl::MakeConstSpan(&loss, 1), absl::MakeConstSpan(&none, 1), options);
}

absl::Status QueueBackwardCallback(std::function<absl::Status()> callback, CallbackOrder order) {
  if (running_callbacks == nullptr) {
    return absl::FailedPreconditionError(
        "QueueBackwardCallback: no Backward is running on this thread");
  }
  std::vector<std::function<absl::Status()>>& items = running_callbacks->items;
  if (order == CallbackOrder::kBeforeEarlier) {
    items.insert(items.begin() + static_cast<std::ptrdiff_t>(running_callbacks->next),
                 std::move(callback));
  } else {
    items.push_back(std::move(callback));
  }
  return absl::OkStatus();
}

bool InBackward() { return running_callbacks != nullptr; }

}  // namespace core
