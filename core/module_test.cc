#include "core/module.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"

namespace core {
namespace {

// y = w * x elementwise with a scalar weight; enough to exercise the Module machinery.
class Scale : public Module {
 public:
  explicit Scale(float w) {
    w_ = RegisterParameter("weight", Tensor::FromVector({w}, {1}).value());
  }
  Scale(ParameterPtr shared) { w_ = RegisterParameter("weight", std::move(shared)); }
  std::string TypeName() const override { return "Scale"; }
  const ParameterPtr& weight() const { return w_; }
  // Whether the input of the last ForwardImpl is still cached, and how often it ran.
  bool cached() const { return x_.defined(); }
  int forward_impls() const { return forward_impls_; }

 protected:
  void ReleaseActivations() override { x_ = Tensor(); }
  absl::StatusOr<Tensor> ForwardImpl(const Tensor& x) override {
    ++forward_impls_;
    x_ = x;
    Tensor y = Tensor::Empty(x.shape());
    for (int64_t i = 0; i < x.numel(); ++i)
      y.data<float>()[i] = w_->data.data<float>()[0] * x.data<float>()[i];
    return y;
  }
  absl::StatusOr<Tensor> BackwardImpl(const Tensor& g) override {
    RETURN_IF_ERROR(w_->EnsureGrad());
    Tensor gx = Tensor::Empty(g.shape());
    for (int64_t i = 0; i < g.numel(); ++i) {
      w_->grad.data<float>()[0] += g.data<float>()[i] * x_.data<float>()[i];
      gx.data<float>()[i] = g.data<float>()[i] * w_->data.data<float>()[0];
    }
    return gx;
  }

 private:
  ParameterPtr w_;
  Tensor x_;
  int forward_impls_ = 0;
};

// Two children applied in order, plus a bias-free parameter of its own.
class Chain : public Module {
 public:
  Chain(std::shared_ptr<Module> a, std::shared_ptr<Module> b) {
    own_ = RegisterParameter("gain", Tensor::FromVector({1.0f}, {1}).value());
    a_ = RegisterModule("first", std::move(a));
    b_ = RegisterModule("second", std::move(b));
  }
  std::string TypeName() const override { return "Chain"; }

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor& x) override {
    ASSIGN_OR_RETURN(Tensor h, a_->Forward(x));
    return b_->Forward(h);
  }
  absl::StatusOr<Tensor> BackwardImpl(const Tensor& g) override {
    ASSIGN_OR_RETURN(Tensor gh, b_->Backward(g));
    return a_->Backward(gh);
  }

 private:
  ParameterPtr own_;
  std::shared_ptr<Module> a_, b_;
};

// A layer sized from "user input": a table of `rows` x 4 floats.
class Table : public Module {
 public:
  explicit Table(int64_t rows) { w_ = AllocateParameter("table", {rows, 4}); }
  std::string TypeName() const override { return "Table"; }
  const ParameterPtr& table() const { return w_; }

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor& x) override { return x; }
  absl::StatusOr<Tensor> BackwardImpl(const Tensor& g) override { return g; }

 private:
  ParameterPtr w_;
};

TEST(ModuleTest, AllocateParameterRecordsFailureInsteadOfAborting) {
  auto ok = std::make_shared<Table>(3);
  EXPECT_TRUE(ok->ConstructionStatus().ok());
  EXPECT_EQ(ok->table()->data.shape(), (Shape{3, 4}));

  // 2^61 rows x 4 floats overflows the byte count; 2^40 rows exceed any host.
  for (int64_t rows : {int64_t{1} << 61, int64_t{1} << 40}) {
    auto huge = std::make_shared<Table>(rows);
    auto model = std::make_shared<Chain>(std::make_shared<Scale>(2.0f), huge);
    const absl::Status status = model->ConstructionStatus();
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
    // Names the module by its path and the parameter.
    EXPECT_NE(status.message().find("second (Table): parameter 'table'"), std::string::npos)
        << status;
    EXPECT_NE(status.message().find(absl::StrCat("[", rows, ", 4]")), std::string::npos) << status;
    // The placeholder has the parameter's rank and no elements.
    EXPECT_EQ(huge->table()->data.shape(), (Shape{0, 0}));
    // The module refuses to run with the same error; the parent fails through it.
    const Tensor x = Tensor::FromVector({1.0f}, {1}).value();
    EXPECT_EQ(huge->Forward(x).status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(huge->Backward(x).status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(model->Forward(x).status().code(), absl::StatusCode::kResourceExhausted);
  }
}

TEST(ModuleTest, NamedParametersDottedAndTiedListedOnce) {
  auto a = std::make_shared<Scale>(2.0f);
  auto b = std::make_shared<Scale>(a->weight());  // tied to a's weight
  auto inner = std::make_shared<Chain>(a, b);
  auto root = std::make_shared<Chain>(inner, std::make_shared<Scale>(3.0f));
  std::vector<std::string> names;
  for (const auto& [name, p] : root->NamedParameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"gain", "first.gain", "first.first.weight",
                                             "second.weight"}));
  EXPECT_EQ(root->Parameters()[2], a->weight());
  EXPECT_EQ(root->NumParameterElements(), 4);
}

TEST(ModuleTest, NamedModulesPreOrderWithPaths) {
  auto a = std::make_shared<Scale>(2.0f);
  auto inner = std::make_shared<Chain>(a, std::make_shared<Scale>(1.0f));
  auto root = std::make_shared<Chain>(inner, std::make_shared<Scale>(3.0f));
  std::vector<std::string> paths;
  for (const auto& [path, m] : root->NamedModules()) paths.push_back(path + ":" + m->TypeName());
  EXPECT_EQ(paths, (std::vector<std::string>{":Chain", "first:Chain", "first.first:Scale",
                                             "first.second:Scale", "second:Scale"}));
  EXPECT_EQ(a->Path(), "first.first");
  EXPECT_EQ(a->Describe(), "first.first (Scale)");
  EXPECT_EQ(root->Describe(), "<root> (Chain)");
}

TEST(ModuleTest, PathClearedWhenParentDestroyed) {
  auto a = std::make_shared<Scale>(2.0f);
  {
    auto parent = std::make_shared<Chain>(a, std::make_shared<Scale>(1.0f));
    EXPECT_EQ(a->Path(), "first");
  }
  EXPECT_EQ(a->Path(), "");
}

TEST(ModuleTest, HooksRunInOrderAroundImplAtEveryLevel) {
  auto a = std::make_shared<Scale>(2.0f);
  auto b = std::make_shared<Scale>(3.0f);
  auto root = std::make_shared<Chain>(a, b);
  std::vector<std::string> events;
  auto record = [&events](std::string tag) {
    return [&events, tag](Module& m, Tensors&) {
      events.push_back(tag + ":" + m.Path());
      return absl::OkStatus();
    };
  };
  auto record_backward = [&events](std::string tag) {
    return [&events, tag](Module& m) {
      events.push_back(tag + ":" + m.Path());
      return absl::OkStatus();
    };
  };
  std::vector<HookHandle> handles;
  for (Module* m : {static_cast<Module*>(root.get()), static_cast<Module*>(a.get()),
                    static_cast<Module*>(b.get())}) {
    handles.push_back(m->RegisterForwardPreHook(record("fpre")));
    handles.push_back(m->RegisterForwardPostHook([&events](Module& m, const Tensors&, Tensors&) {
      events.push_back("fpost:" + m.Path());
      return absl::OkStatus();
    }));
    handles.push_back(m->RegisterBackwardPreHook(record_backward("bpre")));
    handles.push_back(m->RegisterBackwardPostHook(record_backward("bpost")));
  }
  Tensor x = Tensor::FromVector({1.0f, 2.0f}, {2}).value();
  Tensor y = root->Forward(x).value();
  EXPECT_EQ(y.ToVector(), (std::vector<float>{6.0f, 12.0f}));
  Tensor gx = root->Backward(Tensor::FromVector({1.0f, 1.0f}, {2}).value()).value();
  EXPECT_EQ(gx.ToVector(), (std::vector<float>{6.0f, 6.0f}));
  EXPECT_EQ(a->weight()->grad.ToVector(), (std::vector<float>{3.0f * 1 + 3.0f * 2}));
  EXPECT_EQ(events,
            (std::vector<std::string>{"fpre:", "fpre:first", "fpost:first", "fpre:second",
                                      "fpost:second", "fpost:", "bpre:", "bpre:second",
                                      "bpost:second", "bpre:first", "bpost:first", "bpost:"}));
}

TEST(ModuleTest, HandleRemovesHookAndSurvivesModule) {
  auto a = std::make_shared<Scale>(2.0f);
  int calls = 0;
  {
    HookHandle h = a->RegisterForwardPreHook([&](Module&, Tensors&) {
      ++calls;
      return absl::OkStatus();
    });
    EXPECT_TRUE(h.active());
    EXPECT_EQ(a->NumHooks(), 1);
    ASSERT_TRUE(a->Forward(Tensor::Zeros({1})).ok());
  }
  EXPECT_EQ(a->NumHooks(), 0);
  ASSERT_TRUE(a->Forward(Tensor::Zeros({1})).ok());
  EXPECT_EQ(calls, 1);

  HookHandle moved;
  {
    HookHandle h = a->RegisterBackwardPreHook([](Module&) { return absl::OkStatus(); });
    moved = std::move(h);
  }
  EXPECT_TRUE(moved.active());
  a.reset();  // module destroyed first
  EXPECT_FALSE(moved.active());
  moved.Remove();  // and the handle is still safe to use
}

TEST(ModuleTest, HookErrorStopsForwardAndIsReturned) {
  auto a = std::make_shared<Scale>(2.0f);
  bool impl_ran_post = false;
  HookHandle pre = a->RegisterForwardPreHook([](Module& m, Tensors&) {
    return absl::FailedPreconditionError("no group for " + m.Describe());
  });
  HookHandle post = a->RegisterForwardPostHook([&](Module&, const Tensors&, Tensors&) {
    impl_ran_post = true;
    return absl::OkStatus();
  });
  absl::StatusOr<Tensor> y = a->Forward(Tensor::Zeros({1}));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(y.status().message().find("<root> (Scale)"), std::string::npos);
  EXPECT_FALSE(impl_ran_post);
}

TEST(ModuleTest, PostHookMayReplaceOutput) {
  auto a = std::make_shared<Scale>(2.0f);
  HookHandle post = a->RegisterForwardPostHook([](Module&, const Tensors&, Tensors& out) {
    out[0] = Tensor::FromVector({42.0f}, {1}).value();
    return absl::OkStatus();
  });
  EXPECT_EQ(a->Forward(Tensor::Zeros({1})).value().ToVector(), std::vector<float>{42.0f});
}

TEST(ModuleTest, ZeroGrad) {
  auto a = std::make_shared<Scale>(2.0f);
  ASSERT_TRUE(a->Forward(Tensor::FromVector({1.0f}, {1}).value()).ok());
  ASSERT_TRUE(a->Backward(Tensor::FromVector({1.0f}, {1}).value()).ok());
  EXPECT_EQ(a->weight()->grad.ToVector(), std::vector<float>{1.0f});
  a->ZeroGrad();
  EXPECT_EQ(a->weight()->grad.ToVector(), std::vector<float>{0.0f});
  a->ZeroGrad(/*set_to_none=*/true);
  EXPECT_FALSE(a->weight()->grad.defined());
}

namespace checkpointing {

// Forward + Backward of Chain(Scale(2), Scale(3)) on x = [1, 2] with grad [1, 1].
struct Grads {
  std::vector<float> grad_input;
  float grad_first = 0, grad_second = 0;
};

Grads ForwardBackward(Chain& chain, Scale& first, Scale& second) {
  Tensor x = Tensor::FromVector({1.0f, 2.0f}, {2}).value();
  EXPECT_TRUE(chain.Forward(x).ok());
  Tensor g = Tensor::FromVector({1.0f, 1.0f}, {2}).value();
  absl::StatusOr<Tensor> gx = chain.Backward(g);
  EXPECT_TRUE(gx.ok()) << gx.status();
  Grads run;
  if (gx.ok()) run.grad_input = {gx->data<float>()[0], gx->data<float>()[1]};
  run.grad_first = first.weight()->grad.data<float>()[0];
  run.grad_second = second.weight()->grad.data<float>()[0];
  return run;
}

TEST(ModuleCheckpointTest, ForwardDropsSubtreeActivationsAndBackwardRecomputesThemExactly) {
  auto plain_a = std::make_shared<Scale>(2.0f), plain_b = std::make_shared<Scale>(3.0f);
  auto plain = std::make_shared<Chain>(plain_a, plain_b);
  const Grads want = ForwardBackward(*plain, *plain_a, *plain_b);

  auto a = std::make_shared<Scale>(2.0f), b = std::make_shared<Scale>(3.0f);
  auto chain = std::make_shared<Chain>(a, b);
  chain->set_checkpoint_activations(true);
  Tensor x = Tensor::FromVector({1.0f, 2.0f}, {2}).value();
  ASSERT_TRUE(chain->Forward(x).ok());
  EXPECT_FALSE(a->cached());
  EXPECT_FALSE(b->cached());
  EXPECT_TRUE(chain->awaiting_recompute());
  a->ZeroGrad(true);
  b->ZeroGrad(true);
  const Grads got = ForwardBackward(*chain, *a, *b);
  EXPECT_EQ(got.grad_input, want.grad_input);
  EXPECT_EQ(got.grad_first, want.grad_first);
  EXPECT_EQ(got.grad_second, want.grad_second);
  EXPECT_FALSE(chain->awaiting_recompute());
  // Two forwards, each recomputed once in its backward (the first had no backward).
  EXPECT_EQ(a->forward_impls(), 3);
  EXPECT_EQ(b->forward_impls(), 3);
}

TEST(ModuleCheckpointTest, UserHooksFireOncePerPassRecomputeHooksAlsoInTheRecompute) {
  auto a = std::make_shared<Scale>(2.0f), b = std::make_shared<Scale>(3.0f);
  auto chain = std::make_shared<Chain>(a, b);
  chain->set_checkpoint_activations(true);
  int user_pre = 0, user_post = 0, chain_pre = 0, recompute_pre = 0, recompute_seen = 0;
  HookHandle h1 = a->RegisterForwardPreHook([&](Module&, Tensors&) {
    ++user_pre;
    return absl::OkStatus();
  });
  HookHandle h2 = a->RegisterForwardPostHook([&](Module&, const Tensors&, Tensors&) {
    ++user_post;
    return absl::OkStatus();
  });
  HookHandle h3 = chain->RegisterForwardPreHook(
      [&](Module&, Tensors&) {
        ++chain_pre;
        return absl::OkStatus();
      },
      HookOptions{.run_in_recompute = true});
  HookHandle h4 = b->RegisterForwardPreHook(
      [&](Module&, Tensors&) {
        ++recompute_pre;
        if (InRecompute()) ++recompute_seen;
        return absl::OkStatus();
      },
      HookOptions{.run_in_recompute = true});
  ForwardBackward(*chain, *a, *b);
  EXPECT_EQ(user_pre, 1);
  EXPECT_EQ(user_post, 1);
  // The checkpointed module's own forward hooks never run in its recompute.
  EXPECT_EQ(chain_pre, 1);
  // A descendant's run_in_recompute hook runs in both passes and can tell them apart.
  EXPECT_EQ(recompute_pre, 2);
  EXPECT_EQ(recompute_seen, 1);
  EXPECT_FALSE(InRecompute());
}

TEST(ModuleCheckpointTest, NoGradScopeRecomputesNothingAndKeepsNoCaches) {
  auto a = std::make_shared<Scale>(2.0f), b = std::make_shared<Scale>(3.0f);
  auto chain = std::make_shared<Chain>(a, b);
  chain->set_checkpoint_activations(true);
  Tensor x = Tensor::FromVector({1.0f, 2.0f}, {2}).value();
  {
    NoGradScope no_grad;
    EXPECT_FALSE(GradEnabled());
    ASSERT_TRUE(chain->Forward(x).ok());
  }
  EXPECT_TRUE(GradEnabled());
  // Nothing kept to recompute from, nothing recomputed, and, forward-only, every
  // module's caches dropped as its Forward returned.
  EXPECT_FALSE(chain->awaiting_recompute());
  EXPECT_EQ(a->forward_impls(), 1);
  EXPECT_FALSE(a->cached());
  EXPECT_FALSE(b->cached());
  // With gradients, a plain module keeps its caches.
  chain->set_checkpoint_activations(false);
  ASSERT_TRUE(chain->Forward(x).ok());
  EXPECT_TRUE(a->cached());
  EXPECT_TRUE(b->cached());
}

TEST(ModuleCheckpointTest, NestedCheckpointedModuleIsNotRecomputedTwice) {
  auto a = std::make_shared<Scale>(2.0f), b = std::make_shared<Scale>(3.0f);
  auto inner = std::make_shared<Chain>(a, b);
  auto c = std::make_shared<Scale>(5.0f);
  auto outer = std::make_shared<Chain>(inner, c);
  inner->set_checkpoint_activations(true);
  outer->set_checkpoint_activations(true);
  Tensor x = Tensor::FromVector({1.0f, 2.0f}, {2}).value();
  ASSERT_TRUE(outer->Forward(x).ok());
  EXPECT_FALSE(inner->awaiting_recompute());  // the outer drop cleared it
  EXPECT_TRUE(outer->awaiting_recompute());
  Tensor g = Tensor::FromVector({1.0f, 1.0f}, {2}).value();
  absl::StatusOr<Tensor> gx = outer->Backward(g);
  ASSERT_TRUE(gx.ok()) << gx.status();
  const float grad_x0 = gx->data<float>()[0];
  const float grad_a = a->weight()->grad.data<float>()[0];
  EXPECT_EQ(grad_x0, 30.0f);
  EXPECT_EQ(grad_a, 15.0f * (1.0f + 2.0f));
  EXPECT_EQ(a->forward_impls(), 2);  // forward + the outer's recompute only
  EXPECT_EQ(c->forward_impls(), 2);
}

}  // namespace checkpointing

}  // namespace
}  // namespace core
