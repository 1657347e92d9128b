// NOTE [Graph modules] (core/module.h): modules that write only a forward, with several
// tensors in and out, differentiated by the graph, and their hooks placed on it.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "core/module.h"
#include "core/status_macros.h"
#include "core/testing/tiny_ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace core {
namespace {

using testing::Add;
using testing::backward_log;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::Mul;
using testing::Sum;
using testing::Vec;

// Forward(x, mask) -> {y = w * x * mask, aux = sum(w * w)}; no backward written.
class Gate : public Module {
 public:
  explicit Gate(std::vector<float> w) { w_ = RegisterParameter("weight", Vec(std::move(w))); }
  std::string TypeName() const override { return "Gate"; }
  const ParameterPtr& weight() const { return w_; }

 protected:
  absl::StatusOr<Tensors> ForwardGraph(const Tensors& in) override {
    if (in.size() != 2) return absl::InvalidArgumentError(Describe() + ": needs x and mask");
    absl::StatusOr<Tensor> y = Mul(Mul(w_, in[0], "Gate.wx"), in[1], "Gate.mask");
    absl::StatusOr<Tensor> aux = Sum(Mul(w_, w_, "Gate.ww"));
    RETURN_IF_ERROR(y.status());
    RETURN_IF_ERROR(aux.status());
    return Tensors{*y, *aux};
  }

 private:
  ParameterPtr w_;
};

// Applies its child twice (shared weights): y = child(child(x)).
class Twice : public Module {
 public:
  explicit Twice(std::shared_ptr<Gate> g) : gate_(RegisterModule("gate", std::move(g))) {}
  std::string TypeName() const override { return "Twice"; }

 protected:
  absl::StatusOr<Tensors> ForwardGraph(const Tensors& in) override {
    ASSIGN_OR_RETURN(Tensors first, gate_->Call({in[0], in[1]}));
    ASSIGN_OR_RETURN(Tensors second, gate_->Call({first[0], in[1]}));
    ASSIGN_OR_RETURN(Tensor aux, Add(first[1], second[1]));
    return Tensors{second[0], aux};
  }

 private:
  std::shared_ptr<Gate> gate_;
};

TEST(GraphModuleTest, SeveralInputsAndOutputsDifferentiatedByTheGraph) {
  auto gate = std::make_shared<Gate>(std::vector<float>{2, 3});
  Tensor x = Leaf(Vec({1, 4}));
  absl::StatusOr<Tensors> out = gate->Call({x, Vec({1, 0})});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 2u);
  EXPECT_THAT((*out)[0].ToVector(), ElementsAre(2, 0));
  EXPECT_THAT((*out)[1].ToVector(), ElementsAre(13));
  // loss = sum(y) + aux
  absl::StatusOr<Tensor> loss = Add(Sum((*out)[0]), (*out)[1]);
  ASSERT_TRUE(loss.ok());
  ASSERT_TRUE(Backward(*loss).ok());
  // dloss/dw = x * mask + 2w; dloss/dx = w * mask.
  EXPECT_THAT(gate->weight()->grad.ToVector(), ElementsAre(1 + 4, 0 + 6));
  EXPECT_THAT(LeafGrad(x).ToVector(), ElementsAre(2, 0));
}

TEST(GraphModuleTest, AModuleCalledTwiceSumsItsGradientsAndSeesItsHooksPerCall) {
  auto gate = std::make_shared<Gate>(std::vector<float>{2});
  auto twice = std::make_shared<Twice>(gate);
  std::vector<std::string> events;
  std::vector<HookHandle> hooks;
  for (Module* m : {static_cast<Module*>(twice.get()), static_cast<Module*>(gate.get())}) {
    hooks.push_back(m->RegisterForwardPreHook([&events](Module& m, Tensors& in) {
      events.push_back("fpre " + m.TypeName() + " " + std::to_string(in.size()));
      return absl::OkStatus();
    }));
    hooks.push_back(m->RegisterBackwardPreHook([&events](Module& m) {
      events.push_back("bpre " + m.TypeName());
      return absl::OkStatus();
    }));
    hooks.push_back(m->RegisterBackwardPostHook([&events](Module& m) {
      events.push_back("bpost " + m.TypeName());
      return absl::OkStatus();
    }));
  }
  Tensor x = Leaf(Vec({3}));
  absl::StatusOr<Tensor> y = twice->CallOne({x, Vec({1})});
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);  // two outputs
  events.clear();
  absl::StatusOr<Tensors> out = twice->Call({x, Vec({1})});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT((*out)[0].ToVector(), ElementsAre(12));  // w * w * x
  absl::StatusOr<Tensor> loss = Add(Sum((*out)[0]), (*out)[1]);
  ASSERT_TRUE(loss.ok());
  ASSERT_TRUE(Backward(*loss).ok());
  // y = w^2 x + 2 w^2: dy/dw = 2 w x + 4 w = 12 + 8.
  EXPECT_THAT(gate->weight()->grad.ToVector(), ElementsAre(20));
  EXPECT_THAT(LeafGrad(x).ToVector(), ElementsAre(4));
}

TEST(GraphModuleTest, BackwardHooksBracketTheModulesNodesAndParameterGradients) {
  auto gate = std::make_shared<Gate>(std::vector<float>{2});
  std::vector<std::string> log;
  std::vector<float> grad_at_post;
  HookHandle pre = gate->RegisterBackwardPreHook([&](Module&) {
    log.push_back("bpre");
    return absl::OkStatus();
  });
  HookHandle post = gate->RegisterBackwardPostHook([&](Module& m) {
    log.push_back("bpost");
    grad_at_post = static_cast<Gate&>(m).weight()->grad.ToVector();
    return absl::OkStatus();
  });
  Tensor x = Leaf(Vec({3}));
  absl::StatusOr<Tensors> out = gate->Call({x, Vec({1})});
  ASSERT_TRUE(out.ok());
  absl::StatusOr<Tensor> loss = Sum(Mul((*out)[0], Vec({1}), "Consumer"));
  ASSERT_TRUE(loss.ok());
  backward_log = &log;
  ASSERT_TRUE(Backward(*loss).ok());
  backward_log = nullptr;
  // The pre-hook runs when the module's output gradient arrives (before its own nodes); the
  // post-hook after every node of the call and with the parameter's gradient in place. The
  // unused aux output gets no gradient, so its nodes do not run.
  EXPECT_THAT(log, ElementsAre("Sum", "Consumer", "bpre", "Gate.mask", "Gate.wx", "bpost"));
  EXPECT_THAT(grad_at_post, ElementsAre(3));
}

// y = x by a custom function that takes y's gradient in bf16 (NOTE [Autograd]), recording the
// dtype it got.
class TakesBf16 : public Module {
 public:
  std::string TypeName() const override { return "TakesBf16"; }
  DType got = DType::kInt32;

 protected:
  absl::StatusOr<Tensors> ForwardGraph(const Tensors& in) override {
    Tensor y = Vec(in[0].ToVector());
    FunctionOptions options;
    options.bf16_grad_outputs = {0};
    RETURN_IF_ERROR(RecordFunction(
        "TakesBf16", {in[0]}, {&y}, {},
        [this](const BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
          got = ctx.grad(0).dtype();
          ASSIGN_OR_RETURN(Tensor g, ctx.grad(0).ToDType(DType::kFloat32, MemoryTag::kOther));
          return std::vector<Tensor>{g};
        },
        {}, options));
    return Tensors{y};
  }
};

// The identity node a module's backward hooks put on its outputs passes a bf16 gradient through
// to an op that takes it so, as the op alone would get it.
TEST(GraphModuleTest, HooksOnTheOutputsKeepABf16GradientTheProducerTakes) {
  for (bool hooked : {false, true}) {
    SCOPED_TRACE(hooked ? "hooked" : "plain");
    auto m = std::make_shared<TakesBf16>();
    int pre_calls = 0;
    HookHandle pre;
    if (hooked) {
      pre = m->RegisterBackwardPreHook([&](Module&) {
        ++pre_calls;
        return absl::OkStatus();
      });
    }
    absl::StatusOr<Tensor> y = m->CallOne({Leaf(Vec({1, 2}))});
    ASSERT_TRUE(y.ok()) << y.status();
    // A consumer that hands its input a bf16 gradient.
    Tensor z = Vec({0, 0});
    ASSERT_TRUE(
        RecordFunction("Bf16Consumer", {*y}, {&z}, {},
                       [](const BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
                         ASSIGN_OR_RETURN(Tensor g,
                                          ctx.grad(0).ToDType(DType::kBFloat16, MemoryTag::kOther));
                         return std::vector<Tensor>{g};
                       })
            .ok());
    ASSERT_TRUE(Backward({z}, {Vec({1, 1})}).ok());
    EXPECT_EQ(m->got, DType::kBFloat16);
    EXPECT_EQ(pre_calls, hooked ? 1 : 0);
  }
}

TEST(GraphModuleTest, PostHooksOfAModuleWhoseInputsNeedNoGradientRunAtTheEnd) {
  auto gate = std::make_shared<Gate>(std::vector<float>{2});
  std::vector<std::string> log;
  HookHandle post = gate->RegisterBackwardPostHook([&](Module&) {
    log.push_back("bpost");
    return absl::OkStatus();
  });
  absl::StatusOr<Tensors> out = gate->Call({Vec({3}), Vec({1})});  // like token ids
  ASSERT_TRUE(out.ok());
  absl::StatusOr<Tensor> loss = Sum((*out)[0]);
  ASSERT_TRUE(loss.ok());
  backward_log = &log;
  ASSERT_TRUE(Backward(*loss).ok());
  backward_log = nullptr;
  EXPECT_THAT(log, ElementsAre("Sum", "Gate.mask", "Gate.wx", "bpost"));  // aux unused
  EXPECT_THAT(gate->weight()->grad.ToVector(), ElementsAre(3));
}

// Calls its child on its own inputs (neither needs a gradient) and doubles the output.
class Outer : public Module {
 public:
  explicit Outer(std::shared_ptr<Gate> g) : gate_(RegisterModule("gate", std::move(g))) {}
  std::string TypeName() const override { return "Outer"; }

 protected:
  absl::StatusOr<Tensors> ForwardGraph(const Tensors& in) override {
    ASSIGN_OR_RETURN(Tensors y, gate_->Call({in[0], in[1]}));
    ASSIGN_OR_RETURN(Tensor twice, Mul(y[0], Vec({2}), "Outer.twice"));
    return Tensors{twice};
  }

 private:
  std::shared_ptr<Gate> gate_;
};

TEST(GraphModuleTest, BackwardsNestWhenAnOutputGoesStraightToTheLoss) {
  // first -> {y0, aux0}; second(y0) -> {y1, aux1}; loss = sum(y1) + aux0 + aux1. aux0's
  // gradient arrives before second's backward ran; first's backward still begins after it.
  auto first = std::make_shared<Gate>(std::vector<float>{2});
  auto second = std::make_shared<Gate>(std::vector<float>{3});
  std::vector<std::string> log;
  std::vector<HookHandle> hooks;
  for (auto [gate, name] : {std::pair{first, "first"}, std::pair{second, "second"}}) {
    const std::string n = name;
    hooks.push_back(gate->RegisterBackwardPreHook([&log, n](Module&) {
      log.push_back(n + " bpre");
      return absl::OkStatus();
    }));
    hooks.push_back(gate->RegisterBackwardPostHook([&log, n](Module&) {
      log.push_back(n + " bpost");
      return absl::OkStatus();
    }));
  }
  Tensor x = Leaf(Vec({1}));
  absl::StatusOr<Tensors> a = first->Call({x, Vec({1})});
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<Tensors> b = second->Call({(*a)[0], Vec({1})});
  ASSERT_TRUE(b.ok()) << b.status();
  absl::StatusOr<Tensor> loss = Add(Add(Sum((*b)[0]), (*a)[1]), (*b)[1]);
  ASSERT_TRUE(loss.ok()) << loss.status();
  ASSERT_TRUE(Backward(*loss).ok());
  EXPECT_THAT(log, ElementsAre("second bpre", "second bpost", "first bpre", "first bpost"));
  // d/dw1 (w1 w2 x + w1^2 + w2^2) = w2 x + 2 w1 = 3 + 4.
  EXPECT_THAT(first->weight()->grad.ToVector(), ElementsAre(7));
}

TEST(GraphModuleTest, LatePostHooksRunInnerModulesFirst) {
  // Both modules take data that needs no gradient, so both post-hooks run at the end of the
  // backward; the inner one's first, as FSDP needs (a unit ends before its parent).
  auto gate = std::make_shared<Gate>(std::vector<float>{2});
  auto outer = std::make_shared<Outer>(gate);
  std::vector<std::string> log;
  HookHandle inner_post = gate->RegisterBackwardPostHook([&](Module&) {
    log.push_back("gate bpost");
    return absl::OkStatus();
  });
  HookHandle outer_post = outer->RegisterBackwardPostHook([&](Module&) {
    log.push_back("outer bpost");
    return absl::OkStatus();
  });
  absl::StatusOr<Tensors> out = outer->Call({Vec({3}), Vec({1})});
  ASSERT_TRUE(out.ok()) << out.status();
  absl::StatusOr<Tensor> loss = Sum((*out)[0]);
  ASSERT_TRUE(loss.ok());
  ASSERT_TRUE(Backward(*loss).ok());
  EXPECT_THAT(log, ElementsAre("gate bpost", "outer bpost"));
  EXPECT_THAT(gate->weight()->grad.ToVector(), ElementsAre(6));
}

TEST(GraphModuleTest, ForwardHooksSeeAndMayReplaceInputsAndOutputs) {
  auto gate = std::make_shared<Gate>(std::vector<float>{2});
  HookHandle pre = gate->RegisterForwardPreHook([](Module&, Tensors& in) {
    in[1] = Vec({0.5f});  // a new mask
    return absl::OkStatus();
  });
  HookHandle post = gate->RegisterForwardPostHook([](Module&, const Tensors& in, Tensors& out) {
    EXPECT_THAT(in[1].ToVector(), ElementsAre(0.5f));
    out.pop_back();  // drop aux
    return absl::OkStatus();
  });
  absl::StatusOr<Tensor> y = gate->CallOne({Vec({3}), Vec({1})});
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_THAT(y->ToVector(), ElementsAre(3));
}

TEST(GraphModuleTest, NoGradScopePlacesNoNodes) {
  auto gate = std::make_shared<Gate>(std::vector<float>{2});
  int hooks_run = 0;
  HookHandle pre = gate->RegisterBackwardPreHook([&](Module&) {
    ++hooks_run;
    return absl::OkStatus();
  });
  NoGradScope no_grad;
  absl::StatusOr<Tensors> out = gate->Call({Leaf(Vec({3})), Vec({1})});
  ASSERT_TRUE(out.ok());
  EXPECT_FALSE(RequiresGrad((*out)[0]));
  EXPECT_FALSE(RequiresGrad((*out)[1]));
  EXPECT_EQ(hooks_run, 0);
}

// A hand-written module (one tensor in and out, its own backward): y = w * x elementwise.
class Scale : public Module {
 public:
  explicit Scale(std::vector<float> w) { w_ = RegisterParameter("weight", Vec(std::move(w))); }
  std::string TypeName() const override { return "Scale"; }
  const ParameterPtr& weight() const { return w_; }
  int backwards = 0;

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor& x) override {
    x_ = x;
    std::vector<float> y = x.ToVector(), w = w_->data.ToVector();
    for (size_t i = 0; i < y.size(); ++i) y[i] *= w[i];
    return Vec(y);
  }
  absl::StatusOr<Tensor> BackwardImpl(const Tensor& g) override {
    ++backwards;
    if (!x_.defined()) return absl::FailedPreconditionError("Scale: no cached input");
    std::vector<float> gv = g.ToVector(), xv = x_.ToVector(), w = w_->data.ToVector();
    RETURN_IF_ERROR(w_->EnsureGrad());
    float* wg = w_->grad.data<float>();
    std::vector<float> gx(gv.size());
    for (size_t i = 0; i < gv.size(); ++i) {
      wg[i] += gv[i] * xv[i];
      gx[i] = gv[i] * w[i];
    }
    x_ = Tensor();
    return Vec(gx);
  }
  void ReleaseActivations() override { x_ = Tensor(); }

 private:
  ParameterPtr w_;
  Tensor x_;
};

// A graph module calling a hand-written child: y = scale(x) * x.
class ScaleThenSquare : public Module {
 public:
  explicit ScaleThenSquare(std::shared_ptr<Scale> s) : scale_(RegisterModule("scale", s)) {}
  std::string TypeName() const override { return "ScaleThenSquare"; }

 protected:
  absl::StatusOr<Tensors> ForwardGraph(const Tensors& in) override {
    ASSIGN_OR_RETURN(Tensor y, Mul(scale_->CallOne({in[0]}), in[0], "ScaleThenSquare.mul"));
    return Tensors{y};
  }

 private:
  std::shared_ptr<Scale> scale_;
};

TEST(GraphModuleTest, AHandWrittenChildRunsItsBackwardAsOneNodeWithItsHooks) {
  auto scale = std::make_shared<Scale>(std::vector<float>{2, 3});
  auto parent = std::make_shared<ScaleThenSquare>(scale);
  std::vector<std::string> events;
  HookHandle pre = scale->RegisterBackwardPreHook([&](Module&) {
    events.push_back(absl::StrCat("pre backwards=", scale->backwards));
    return absl::OkStatus();
  });
  HookHandle post = scale->RegisterBackwardPostHook([&](Module&) {
    events.push_back(absl::StrCat("post backwards=", scale->backwards,
                                  " grad=", scale->weight()->grad.ToVector()[1]));
    return absl::OkStatus();
  });
  const Tensor x = Leaf(Vec({1, 4}));
  absl::StatusOr<Tensor> y = parent->CallOne({x});
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_THAT(y->ToVector(), ElementsAre(2, 48));  // w * x * x
  ASSERT_TRUE(Backward(*Sum(*y)).ok());
  // d/dw = x * x; d/dx = 2 w x.
  EXPECT_THAT(scale->weight()->grad.ToVector(), ElementsAre(1, 16));
  EXPECT_THAT(LeafGrad(x).ToVector(), ElementsAre(4, 24));
  EXPECT_THAT(events, ElementsAre("pre backwards=0", "post backwards=1 grad=16"));
}

TEST(GraphModuleTest, AHandWrittenModuleTakesOneInputInAGraph) {
  auto scale = std::make_shared<Scale>(std::vector<float>{2});
  absl::StatusOr<Tensors> out = scale->Call({Vec({1}), Vec({1})});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("(Scale) has a hand-written backward"));
}

// A graph module of one input and one output: y = w * x * x.
class Square : public Module {
 public:
  explicit Square(std::vector<float> w) { w_ = RegisterParameter("weight", Vec(std::move(w))); }
  std::string TypeName() const override { return "Square"; }
  const ParameterPtr& weight() const { return w_; }

 protected:
  absl::StatusOr<Tensors> ForwardGraph(const Tensors& in) override {
    ASSIGN_OR_RETURN(Tensor y, Mul(Mul(w_, in[0], "Square.wx"), in[0], "Square.wxx"));
    return Tensors{y};
  }

 private:
  ParameterPtr w_;
};

TEST(GraphModuleTest, AGraphModuleRunsThroughForwardAndBackward) {
  auto square = std::make_shared<Square>(std::vector<float>{2, 3});
  int pre = 0, post = 0;
  HookHandle h1 = square->RegisterBackwardPreHook([&](Module&) {
    ++pre;
    return absl::OkStatus();
  });
  HookHandle h2 = square->RegisterBackwardPostHook([&](Module&) {
    EXPECT_EQ(pre, 1);
    ++post;
    return absl::OkStatus();
  });
  absl::StatusOr<Tensor> y = square->Forward(Vec({1, 4}));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_THAT(y->ToVector(), ElementsAre(2, 48));
  absl::StatusOr<Tensor> gx = square->Backward(Vec({1, 1}));
  ASSERT_TRUE(gx.ok()) << gx.status();
  EXPECT_THAT(gx->ToVector(), ElementsAre(4, 24));  // 2 w x
  EXPECT_THAT(square->weight()->grad.ToVector(), ElementsAre(1, 16));
  EXPECT_EQ(pre, 1);
  EXPECT_EQ(post, 1);
  // The graph is gone with the Backward.
  absl::StatusOr<Tensor> again = square->Backward(Vec({1, 1}));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("(Square): Backward without a Forward"));
}

// One input, two outputs: {w * x, x}.
class Both : public Square {
 public:
  using Square::Square;
  std::string TypeName() const override { return "Both"; }

 protected:
  absl::StatusOr<Tensors> ForwardGraph(const Tensors& in) override {
    ASSIGN_OR_RETURN(Tensor y, Mul(weight(), in[0], "Both.wx"));
    return Tensors{y, in[0]};
  }
};

TEST(GraphModuleTest, ForwardNeedsExactlyOneOutput) {
  auto both = std::make_shared<Both>(std::vector<float>{2});
  absl::StatusOr<Tensor> y = both->Forward(Vec({1}));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(y.status().message(),
              HasSubstr("(Both) returned 2 outputs; Forward needs exactly one"));
}

// Overrides neither ForwardGraph nor ForwardImpl.
class Empty : public Module {
 public:
  std::string TypeName() const override { return "Empty"; }
};

TEST(GraphModuleTest, AModuleWithoutAForwardIsUnimplemented) {
  auto empty = std::make_shared<Empty>();
  for (const absl::Status& s :
       {empty->Forward(Vec({1})).status(), empty->Call({Vec({1})}).status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(s.message(), HasSubstr("(Empty) overrides neither ForwardGraph nor ForwardImpl"));
  }
}

TEST(GraphModuleTest, AnErrorArgumentIsReturnedUnchanged) {
  auto gate = std::make_shared<Gate>(std::vector<float>{2});
  absl::StatusOr<Tensor> bad = absl::InvalidArgumentError("Embedding: id 9 out of range");
  EXPECT_EQ(gate->Call({bad, Vec({1})}).status(), bad.status());
}

// Two gates in a row sharing the mask; `second` may be checkpointed. The weight of the gate
// inside `second` is also used outside it, after it (a tied weight).
class TwoGates : public Module {
 public:
  TwoGates() {
    first_ = RegisterModule("first", std::make_shared<Gate>(std::vector<float>{2, -1, 3}));
    second_ = RegisterModule(
        "second", std::make_shared<Twice>(std::make_shared<Gate>(std::vector<float>{0.5, 4, 1})));
  }
  std::string TypeName() const override { return "TwoGates"; }
  const std::shared_ptr<Gate>& first() const { return first_; }
  const std::shared_ptr<Twice>& second() const { return second_; }

 protected:
  absl::StatusOr<Tensors> ForwardGraph(const Tensors& in) override {
    ASSIGN_OR_RETURN(Tensors a, first_->Call({in[0], in[1]}));
    ASSIGN_OR_RETURN(Tensors b, second_->Call({a[0], in[1]}));
    const ParameterPtr& inner = second_->NamedChildren()[0].second->OwnParameters()[0].second;
    ASSIGN_OR_RETURN(Tensor tied, Mul(b[0], inner, "Tied"));
    ASSIGN_OR_RETURN(Tensor loss, Add(Sum(tied), Add(a[1], b[1])));
    return Tensors{loss};
  }

 private:
  std::shared_ptr<Gate> first_;
  std::shared_ptr<Twice> second_;
};

struct Grads {
  std::vector<float> x, first, second;
};

Grads RunTwoGates(TwoGates& model) {
  model.ZeroGrad(/*set_to_none=*/true);
  Tensor x = Leaf(Vec({1, -2, 0.5}));
  absl::StatusOr<Tensor> loss = model.CallOne({x, Vec({1, 1, 0})});
  EXPECT_TRUE(loss.ok()) << loss.status();
  EXPECT_TRUE(Backward(*loss).ok());
  return Grads{LeafGrad(x).ToVector(), model.first()->weight()->grad.ToVector(),
               model.Parameters()[1]->grad.ToVector()};
}

TEST(GraphModuleCheckpointTest, GradientsAreTheBitsOfThePlainRun) {
  auto model = std::make_shared<TwoGates>();
  const Grads plain = RunTwoGates(*model);
  model->second()->set_checkpoint_activations(true);
  const Grads checkpointed = RunTwoGates(*model);
  EXPECT_EQ(plain.x, checkpointed.x);
  EXPECT_EQ(plain.first, checkpointed.first);
  EXPECT_EQ(plain.second, checkpointed.second);  // also used after the checkpointed module
  EXPECT_NE(plain.second, std::vector<float>(3, 0.0f));
}

TEST(GraphModuleCheckpointTest, TheForwardKeepsOnlyTheInputsAndOneNode) {
  auto model = std::make_shared<TwoGates>();
  model->second()->set_checkpoint_activations(true);
  Tensor x = Leaf(Vec({1, -2, 0.5}));
  absl::StatusOr<Tensors> b = model->second()->Call({x, Vec({1, 1, 0})});
  ASSERT_TRUE(b.ok()) << b.status();
  const Node* node = (*b)[0].autograd_meta()->node.get();
  EXPECT_EQ(node->name(), "Checkpoint second (Twice)");
  EXPECT_EQ((*b)[1].autograd_meta()->node.get(), node);  // one node for both outputs
  // Its edges: the input x, the mask (no gradient), and the inner gate's weight.
  ASSERT_EQ(node->next_edges().size(), 3u);
  EXPECT_EQ(node->next_edges()[1].node, nullptr);
}

TEST(GraphModuleCheckpointTest, HooksInTheRecompute) {
  auto model = std::make_shared<TwoGates>();
  model->second()->set_checkpoint_activations(true);
  Module& inner = *model->second()->NamedChildren()[0].second;
  int user_forward = 0, recompute_forward = 0, seen_in_recompute = 0, backward_pre = 0;
  HookHandle h1 = inner.RegisterForwardPreHook([&](Module&, Tensors&) {
    ++user_forward;
    return absl::OkStatus();
  });
  HookHandle h2 = inner.RegisterForwardPreHook(
      [&](Module&, Tensors&) {
        ++recompute_forward;
        if (InRecompute()) ++seen_in_recompute;
        return absl::OkStatus();
      },
      HookOptions{.run_in_recompute = true});
  HookHandle h3 = inner.RegisterBackwardPreHook([&](Module&) {
    ++backward_pre;
    return absl::OkStatus();
  });
  RunTwoGates(*model);
  EXPECT_EQ(user_forward, 2);       // the gate is called twice, once per call in the forward
  EXPECT_EQ(recompute_forward, 4);  // and again in the recompute
  EXPECT_EQ(seen_in_recompute, 2);
  EXPECT_EQ(backward_pre, 2);  // its backward runs once per call, inside the recompute's
  EXPECT_FALSE(InRecompute());
  EXPECT_TRUE(GradEnabled());
}

TEST(GraphModuleCheckpointTest, AnInputWrittenBeforeTheBackwardIsCaught) {
  auto model = std::make_shared<TwoGates>();
  model->second()->set_checkpoint_activations(true);
  Tensor x = Leaf(Vec({1, -2, 0.5}));
  absl::StatusOr<Tensors> a = model->first()->Call({x, Vec({1, 1, 0})});
  ASSERT_TRUE(a.ok());
  absl::StatusOr<Tensors> b = model->second()->Call({(*a)[0], Vec({1, 1, 0})});
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE((*a)[0].CopyFrom(Vec({0, 0, 0})).ok());
  absl::StatusOr<Tensor> loss = Sum((*b)[0]);
  ASSERT_TRUE(loss.ok());
  absl::Status s = Backward(*loss);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("Checkpoint second (Twice)"));
  EXPECT_THAT(s.message(), HasSubstr("modified in place"));
}

TEST(GraphModuleCheckpointTest, UnderNoGradScopeItRunsPlain) {
  auto model = std::make_shared<TwoGates>();
  model->second()->set_checkpoint_activations(true);
  NoGradScope no_grad;
  absl::StatusOr<Tensor> loss = model->CallOne({Leaf(Vec({1, -2, 0.5})), Vec({1, 1, 0})});
  ASSERT_TRUE(loss.ok());
  EXPECT_FALSE(RequiresGrad(*loss));
}

}  // namespace
}  // namespace core
