// NOTE [Graph modules] (core/module.h): modules that write only a forward, with several
// tensors in and out, differentiated by the graph, and their hooks placed on it.
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/module.h"
#include "core/status_macros.h"
#include "core/testing/tiny_ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::Add;
using testing::backward_log;
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

// A hand-written module (one tensor in and out, its own backward).
class Identity : public Module {
 public:
  std::string TypeName() const override { return "Identity"; }

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor& x) override { return x; }
  absl::StatusOr<Tensor> BackwardImpl(const Tensor& g) override { return g; }
};

TEST(GraphModuleTest, EachKindRefusesTheOthersEntryPoints) {
  auto gate = std::make_shared<Gate>(std::vector<float>{2});
  absl::StatusOr<Tensor> y = gate->Forward(Vec({1}));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(y.status().message(), HasSubstr("(Gate) is a graph module"));
  auto id = std::make_shared<Identity>();
  absl::StatusOr<Tensors> out = id->Call({Vec({1})});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(out.status().message(), HasSubstr("hand-written backward"));
  gate->set_checkpoint_activations(true);
  EXPECT_EQ(gate->Call({Vec({1}), Vec({1})}).status().code(), absl::StatusCode::kUnimplemented);
}

TEST(GraphModuleTest, AnErrorArgumentIsReturnedUnchanged) {
  auto gate = std::make_shared<Gate>(std::vector<float>{2});
  absl::StatusOr<Tensor> bad = absl::InvalidArgumentError("Embedding: id 9 out of range");
  EXPECT_EQ(gate->Call({bad, Vec({1})}).status(), bad.status());
}

}  // namespace
}  // namespace core
