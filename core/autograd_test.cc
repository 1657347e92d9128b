#include "core/autograd.h"

#include <memory>
#include <string>
#include <vector>

#include "core/status_macros.h"
#include "core/tensor.h"
#include "core/testing/tiny_ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using testing::Add;
using testing::backward_log;
using testing::Log;
using testing::Mul;
using testing::Sum;
using testing::Vec;

// NOTE [bf16 gradient copies]: a producer offering a box; the consumer leaves its gradient's
// bf16 copy there. The producer gets the copy only when that gradient reached it unchanged.
struct CopyRun {
  bool producer_got_copy = false;
  Tensor grad;
};

CopyRun RunWithCopy(bool second_consumer) {
  CopyRun run;
  const Tensor x = Leaf(Vec({1, 2}));
  // y = producer(x): identity, offering the box.
  Tensor y = Detach(Vec({1, 2}));
  FunctionOptions options;
  options.bf16_grad_copy = std::make_shared<Bf16GradCopy>();
  EXPECT_TRUE(RecordFunction(
                  "Producer", {x}, {&y}, {},
                  [&run, box = options.bf16_grad_copy](
                      const BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
                    const Tensor copy = TakeBf16GradCopy(box, ctx.grad(0));
                    run.producer_got_copy = copy.defined();
                    run.grad = ctx.grad(0);
                    return std::vector<Tensor>{ctx.grad(0)};
                  },
                  {}, options)
                  .ok());
  // z = consumer(y) = 3 y, writing the copy of its gradient for y's producer.
  Tensor z = Detach(Vec({3, 6}));
  EXPECT_TRUE(
      RecordFunction("Consumer", {y}, {&z}, {},
                     [box = ProducerBf16GradCopy(y)](
                         const BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
                       std::vector<float> g = ctx.grad(0).ToVector();
                       for (float& v : g) v *= 3;
                       Tensor gy = Vec(g);
                       if (box != nullptr) {
                         box->sent = gy;
                         box->copy = gy.ToDType(DType::kBFloat16, MemoryTag::kActivation).value();
                       }
                       return std::vector<Tensor>{gy};
                     })
          .ok());
  absl::StatusOr<Tensor> loss = Sum(z);
  if (second_consumer) loss = Add(loss, Sum(y));
  EXPECT_TRUE(loss.ok());
  EXPECT_TRUE(Backward(*loss).ok());
  return run;
}

TEST(AutogradTest, AProducerTakesTheBf16CopyOfAGradientOnlyFromItsSoleConsumer) {
  const CopyRun sole = RunWithCopy(/*second_consumer=*/false);
  EXPECT_TRUE(sole.producer_got_copy);
  EXPECT_THAT(sole.grad.ToVector(), ElementsAre(3, 3));
  // A second consumer: the engine sums into a new tensor, the copy no longer matches it.
  const CopyRun summed = RunWithCopy(/*second_consumer=*/true);
  EXPECT_FALSE(summed.producer_got_copy);
  EXPECT_THAT(summed.grad.ToVector(), ElementsAre(4, 4));
}

TEST(AutogradTest, ChainRuleThroughSavedTensors) {
  Tensor x = Leaf(Vec({1, 2, 3}));
  absl::StatusOr<Tensor> loss = Sum(Mul(x, x));
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_TRUE(RequiresGrad(*loss));
  ASSERT_TRUE(Backward(*loss).ok());
  EXPECT_THAT(LeafGrad(x).ToVector(), ElementsAre(2, 4, 6));
}

TEST(AutogradTest, GradientsOfATensorUsedTwiceAreSummedInConsumerOrder) {
  std::vector<std::string> log;
  backward_log = &log;
  Tensor x = Leaf(Vec({1, 2, 3}));
  // y = x * x (first consumer) + x * 3 (second consumer).
  absl::StatusOr<Tensor> square = Mul(x, x, "Square");
  absl::StatusOr<Tensor> triple = Mul(x, Vec({3, 3, 3}), "Triple");
  absl::StatusOr<Tensor> loss = Sum(Add(square, triple));
  ASSERT_TRUE(loss.ok()) << loss.status();
  ASSERT_TRUE(Backward(*loss).ok());
  backward_log = nullptr;
  EXPECT_THAT(LeafGrad(x).ToVector(), ElementsAre(5, 7, 9));  // 2x + 3
  // Reverse of the forward: the consumer made last runs first.
  EXPECT_THAT(log, ElementsAre("Sum", "Add", "Triple", "Square"));
}

TEST(AutogradTest, ParameterGradientsAccumulateIntoParameterGrad) {
  ParameterPtr w = Parameter::Make(Vec({1, -2}));
  for (int step = 0; step < 2; ++step) {
    absl::StatusOr<Tensor> loss = Sum(Mul(w, Vec({3, 4})));
    ASSERT_TRUE(loss.ok()) << loss.status();
    ASSERT_TRUE(Backward(*loss).ok());
  }
  ASSERT_TRUE(w->grad.defined());
  EXPECT_EQ(w->grad.storage()->tag(), MemoryTag::kGrad);
  EXPECT_THAT(w->grad.ToVector(), ElementsAre(6, 8));  // two backwards add
  // Every use shares one leaf record.
  EXPECT_EQ(Value(w).autograd_meta(), Value(w).autograd_meta());
}

TEST(AutogradTest, AParameterGradientLandsAsSoonAsItsLastConsumerRan) {
  ParameterPtr w = Parameter::Make(Vec({2}));
  Node* accumulator = Value(w).autograd_meta()->node.get();  // made before every op below
  std::vector<std::string> log;
  backward_log = &log;
  accumulator->AddPostHook([] {
    Log("AccumulateGrad");
    return absl::OkStatus();
  });
  Tensor x = Leaf(Vec({3}));
  absl::StatusOr<Tensor> square = Mul(x, x, "Square");
  absl::StatusOr<Tensor> scaled = Mul(w, Vec({5}), "Scaled");
  absl::StatusOr<Tensor> loss = Sum(Add(square, scaled));
  ASSERT_TRUE(loss.ok());
  ASSERT_TRUE(Backward(*loss).ok());
  backward_log = nullptr;
  EXPECT_THAT(log, ElementsAre("Sum", "Add", "Scaled", "AccumulateGrad", "Square"));
  EXPECT_THAT(w->grad.ToVector(), ElementsAre(5));
}

TEST(AutogradTest, AParameterGradientIsFp32AlsoForBf16Data) {
  ParameterPtr w =
      Parameter::Make(Vec({1, 2}).ToDType(DType::kBFloat16, MemoryTag::kParam).value());
  Tensor y = Tensor::Zeros({2});
  ASSERT_TRUE(RecordFunction("UseW", {Value(w)}, {&y}, {},
                             [](const BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
                               return std::vector<Tensor>{ctx.grad(0)};
                             })
                  .ok());
  ASSERT_TRUE(Backward({y}, {Vec({0.5, -3})}).ok());
  EXPECT_EQ(w->grad.dtype(), DType::kFloat32);
  EXPECT_EQ(w->grad.storage()->tag(), MemoryTag::kGrad);
  ASSERT_TRUE(Backward({y}, {Vec({1, 1})}).code() == absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(w->grad.ToVector(), ElementsAre(0.5, -3));
}

TEST(AutogradTest, ParameterWithoutRequiresGradIsNoLeaf) {
  ParameterPtr w = Parameter::Make(Vec({1}), /*requires_grad=*/false);
  EXPECT_FALSE(RequiresGrad(Value(w)));
  absl::StatusOr<Tensor> y = Mul(w, Vec({2}));
  ASSERT_TRUE(y.ok());
  EXPECT_FALSE(RequiresGrad(*y));
}

TEST(AutogradTest, SecondBackwardThroughAFreedGraphNamesOpAndTensor) {
  Tensor x = Leaf(Vec({1, 2}));
  absl::StatusOr<Tensor> loss = Sum(Mul(x, x));
  ASSERT_TRUE(loss.ok());
  ASSERT_TRUE(Backward(*loss).ok());
  absl::Status again = Backward(*loss);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.message(), HasSubstr("'Mul'"));
  EXPECT_THAT(again.message(), HasSubstr("saved tensor 'a'"));
  EXPECT_THAT(LeafGrad(x).ToVector(), ElementsAre(2, 4));  // nothing added by the failure
}

TEST(AutogradTest, RetainGraphAllowsASecondBackward) {
  Tensor x = Leaf(Vec({1, 2}));
  absl::StatusOr<Tensor> loss = Sum(Mul(x, x));
  ASSERT_TRUE(loss.ok());
  ASSERT_TRUE(Backward(*loss, {.retain_graph = true}).ok());
  ASSERT_TRUE(Backward(*loss).ok());
  EXPECT_THAT(LeafGrad(x).ToVector(), ElementsAre(4, 8));
}

TEST(AutogradTest, SavedTensorWrittenInPlaceIsFailedPrecondition) {
  Tensor x = Leaf(Vec({1, 2}));
  absl::StatusOr<Tensor> y = Mul(x, x);
  ASSERT_TRUE(y.ok());
  absl::StatusOr<Tensor> z = Mul(*y, Vec({1, 1}), "Scale");
  ASSERT_TRUE(z.ok());
  ASSERT_TRUE(y->CopyFrom(Vec({7, 7})).ok());  // y is saved by Scale
  absl::StatusOr<Tensor> loss = Sum(*z);
  ASSERT_TRUE(loss.ok());
  absl::Status s = Backward(*loss);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("Scale"));
  EXPECT_THAT(s.message(), HasSubstr("saved tensor 'a'"));
  EXPECT_THAT(s.message(), HasSubstr("modified in place"));
}

TEST(AutogradTest, NoGradScopeRecordsNothingAndDetachDropsTheRecord) {
  Tensor x = Leaf(Vec({1, 2}));
  {
    NoGradScope no_grad;
    EXPECT_FALSE(GradEnabled());
    absl::StatusOr<Tensor> y = Mul(x, x);
    ASSERT_TRUE(y.ok());
    EXPECT_FALSE(RequiresGrad(*y));
  }
  EXPECT_TRUE(GradEnabled());
  Tensor d = Detach(x);
  EXPECT_FALSE(RequiresGrad(d));
  EXPECT_TRUE(d.SharesStorage(x));
  absl::Status s = Backward(d);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("no autograd record"));
}

TEST(AutogradTest, SeedsAreCheckedAndNonScalarsNeedOne) {
  Tensor x = Leaf(Vec({1, 2}));
  absl::StatusOr<Tensor> y = Mul(x, x);
  ASSERT_TRUE(y.ok());
  absl::Status s = Backward(*y);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("needs a gradient"));
  s = Backward({*y}, {Vec({1, 2, 3})});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(Backward({*y}, {Vec({1, 10})}).ok());
  EXPECT_THAT(LeafGrad(x).ToVector(), ElementsAre(2, 40));
}

TEST(AutogradTest, AGradientOfTheWrongSizeNamesTheOp) {
  Tensor x = Leaf(Vec({1, 2}));
  Tensor y = Tensor::Zeros({2});
  ASSERT_TRUE(RecordFunction("Broken", {x}, {&y}, {},
                             [](const BackwardContext&) -> absl::StatusOr<std::vector<Tensor>> {
                               return std::vector<Tensor>{Tensor::Zeros({3})};
                             })
                  .ok());
  absl::Status s = Backward({y}, {Vec({1, 1})});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'Broken' passed a gradient"));
}

TEST(AutogradTest, AFailingBackwardIsReturnedWithTheOpName) {
  Tensor x = Leaf(Vec({1}));
  Tensor y = Tensor::Zeros({1});
  ASSERT_TRUE(RecordFunction("Fails", {x}, {&y}, {},
                             [](const BackwardContext&) -> absl::StatusOr<std::vector<Tensor>> {
                               return absl::InternalError("kernel refused");
                             })
                  .ok());
  absl::Status s = Backward(y);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("backward of 'Fails': kernel refused"));
}

TEST(AutogradTest, UnusedOutputsOfAMultiOutputOpGetZeroGradients) {
  Tensor x = Leaf(Vec({1, 2}));
  Tensor a = Tensor::Zeros({2}), b = Tensor::Zeros({2});
  std::vector<float> seen_b;
  ASSERT_TRUE(
      RecordFunction("Split2", {x}, {&a, &b}, {},
                     [&](const BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
                       seen_b = ctx.grad(1).ToVector();
                       return std::vector<Tensor>{ctx.grad(0)};
                     })
          .ok());
  absl::StatusOr<Tensor> loss = Sum(a);  // b unused
  ASSERT_TRUE(loss.ok());
  ASSERT_TRUE(Backward(*loss).ok());
  EXPECT_THAT(seen_b, ElementsAre(0, 0));
  EXPECT_THAT(LeafGrad(x).ToVector(), ElementsAre(1, 1));
}

TEST(AutogradTest, ABackwardMayWriteAParameterGradientItself) {
  ParameterPtr w = Parameter::Make(Vec({5, 6}));
  ASSERT_TRUE(w->EnsureGrad().ok());
  w->grad.Fill(1.0f);
  Tensor x = Vec({2, 3});
  Tensor y = Tensor::Zeros({2});
  ParameterPtr seen;
  ASSERT_TRUE(
      RecordFunction("FusedScale", {x, Value(w)}, {&y}, {x},
                     [&](const BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
                       EXPECT_FALSE(ctx.needs_grad(0));
                       EXPECT_TRUE(ctx.needs_grad(1));
                       EXPECT_EQ(ctx.parameter(0), nullptr);
                       seen = ctx.parameter(1);
                       // beta 1: grad += g * x, written in place.
                       for (int i = 0; i < 2; ++i) {
                         seen->grad.data<float>()[i] +=
                             ctx.grad(0).data<float>()[i] * ctx.saved(0).data<float>()[i];
                       }
                       return std::vector<Tensor>{Tensor(), Tensor()};
                     })
          .ok());
  ASSERT_TRUE(Backward({y}, {Vec({1, 1})}).ok());
  EXPECT_EQ(seen, w);
  EXPECT_THAT(w->grad.ToVector(), ElementsAre(3, 4));
}

TEST(AutogradTest, SavedParametersAreReadAsTheyAreAtBackward) {
  ParameterPtr w = Parameter::Make(Vec({1, 1}));
  Tensor x = Leaf(Vec({1, 2}));
  absl::StatusOr<Tensor> loss = Sum(Mul(x, w));
  ASSERT_TRUE(loss.ok());
  // As FSDP does between forward and backward: the parameter's data is another tensor.
  w->data = Vec({10, 20});
  ASSERT_TRUE(Backward(*loss, {.retain_graph = true}).ok());
  EXPECT_THAT(LeafGrad(x).ToVector(), ElementsAre(10, 20));
  w->data = Vec({1, 2, 3});  // resharded, not gathered again
  absl::Status s = Backward(*loss);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("saved parameter 'b' was [2] float32"));
}

TEST(AutogradTest, HooksAndCallbacksRunInOrder) {
  Tensor x = Leaf(Vec({1, 2}));
  absl::StatusOr<Tensor> y = Mul(x, Vec({3, 3}));
  ASSERT_TRUE(y.ok());
  std::vector<std::string> events;
  Node* node = y->autograd_meta()->node.get();
  node->AddPreHook([&](std::vector<Tensor>& grads) {
    events.push_back("pre");
    grads[0] = Vec({2, 2});  // replaces the incoming gradient
    EXPECT_TRUE(QueueBackwardCallback([&] {
                  events.push_back("callback");
                  return absl::OkStatus();
                }).ok());
    return absl::OkStatus();
  });
  node->AddPostHook([&] {
    events.push_back("post");
    return absl::OkStatus();
  });
  EXPECT_FALSE(InBackward());
  EXPECT_EQ(QueueBackwardCallback([] { return absl::OkStatus(); }).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Backward({*y}, {Vec({1, 1})}).ok());
  EXPECT_THAT(events, ElementsAre("pre", "post", "callback"));
  EXPECT_THAT(LeafGrad(x).ToVector(), ElementsAre(6, 6));
}

TEST(AutogradTest, CallbacksQueuedBeforeEarlierOnesRunAsAStack) {
  Tensor x = Leaf(Vec({1, 2}));
  absl::StatusOr<Tensor> y = Mul(x, Vec({3, 3}));
  ASSERT_TRUE(y.ok());
  std::vector<std::string> events;
  const auto log = [&events](std::string name) {
    return [&events, name] {
      events.push_back(name);
      return absl::OkStatus();
    };
  };
  y->autograd_meta()->node->AddPreHook([&](std::vector<Tensor>&) {
    EXPECT_TRUE(QueueBackwardCallback(log("a")).ok());
    EXPECT_TRUE(QueueBackwardCallback(log("outer"), CallbackOrder::kBeforeEarlier).ok());
    EXPECT_TRUE(QueueBackwardCallback(log("inner"), CallbackOrder::kBeforeEarlier).ok());
    // One that queues more while the callbacks run: its stacked one runs next.
    EXPECT_TRUE(QueueBackwardCallback([&] {
                  events.push_back("b");
                  EXPECT_TRUE(QueueBackwardCallback(log("c")).ok());
                  return QueueBackwardCallback(log("stacked"), CallbackOrder::kBeforeEarlier);
                }).ok());
    return absl::OkStatus();
  });
  ASSERT_TRUE(Backward({*y}, {Vec({1, 1})}).ok());
  EXPECT_THAT(events, ElementsAre("inner", "outer", "a", "b", "stacked", "c"));
}

TEST(AutogradTest, AnErrorArgumentIsReturnedUnchanged) {
  absl::StatusOr<Tensor> bad = absl::InvalidArgumentError("Linear: shapes differ");
  absl::StatusOr<Tensor> y = Sum(Mul(bad, Vec({1})));
  EXPECT_EQ(y.status(), bad.status());
  ParameterPtr null;
  EXPECT_THAT(Mul(null, Vec({1})).status().message(), HasSubstr("null ParameterPtr"));
}

TEST(AutogradTest, SavedTensorsAreFreedAsTheirNodeRuns) {
  Tensor x = Leaf(Vec({1, 2}));
  absl::StatusOr<Tensor> y = Mul(x, x);
  ASSERT_TRUE(y.ok());
  absl::StatusOr<Tensor> z = Mul(*y, *y);
  ASSERT_TRUE(z.ok());
  std::weak_ptr<Storage> y_storage = y->storage();
  y = Tensor();  // only z's node holds y now
  EXPECT_FALSE(y_storage.expired());
  absl::StatusOr<Tensor> loss = Sum(*z);
  ASSERT_TRUE(loss.ok());
  ASSERT_TRUE(Backward(*loss).ok());
  EXPECT_TRUE(y_storage.expired());
  EXPECT_THAT(LeafGrad(x).ToVector(), ElementsAre(4, 32));  // 4 x^3
}

TEST(AutogradTest, ALongGraphDroppedWithoutBackwardDoesNotRecurse) {
  // Dropping the last handle of a 300000-op chain frees every node; one stack frame per node
  // would overflow the stack.
  Tensor y = Leaf(Vec({1}));
  for (int i = 0; i < 300000; ++i) {
    absl::StatusOr<Tensor> next = Add(y, Vec({0}));
    ASSERT_TRUE(next.ok());
    y = *std::move(next);
  }
  std::weak_ptr<Node> first = y.autograd_meta()->node;
  y = Tensor();
  EXPECT_TRUE(first.expired());
}

// NOTE [Autograd]: a bf16 gradient reaches a node as it is only where the node takes bf16 for
// that output and it is the tensor's only gradient; otherwise it arrives widened to fp32.
struct Bf16Run {
  DType seen = DType::kInt32;
  std::vector<float> values;
};

// x -> Producer (takes bf16 when `takes`) -> y; consumers of y each return gradient `grads[k]`
// (bf16 when it says so) for y. Returns what Producer's backward saw and x's gradient.
Bf16Run RunBf16(bool takes, const std::vector<Tensor>& grads, std::vector<float>* leaf) {
  Bf16Run run;
  Tensor x = Leaf(Vec({1, 2}));
  Tensor y = Tensor::Zeros({2});
  FunctionOptions options;
  if (takes) options.bf16_grad_outputs = {0};
  EXPECT_TRUE(RecordFunction(
                  "Producer", {x}, {&y}, {},
                  [&run](const BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
                    run.seen = ctx.grad(0).dtype();
                    run.values = ctx.grad(0).ToVector();
                    return std::vector<Tensor>{Detach(ctx.grad(0))};
                  },
                  {}, options)
                  .ok());
  std::vector<Tensor> outs;
  for (const Tensor& g : grads) {
    Tensor out = Tensor::Zeros({2});
    EXPECT_TRUE(RecordFunction("Consumer", {y}, {&out}, {},
                               [g](const BackwardContext&) -> absl::StatusOr<std::vector<Tensor>> {
                                 return std::vector<Tensor>{g};
                               })
                    .ok());
    outs.push_back(out);
  }
  std::vector<Tensor> seeds(outs.size(), Vec({1, 1}));
  EXPECT_TRUE(Backward(outs, seeds).ok());
  *leaf = LeafGrad(x).ToVector();
  EXPECT_EQ(LeafGrad(x).dtype(), DType::kFloat32);
  return run;
}

TEST(AutogradTest, Bf16GradientsReachOnlyNodesThatTakeThem) {
  const Tensor g16 = Vec({0.5f, -3}).ToDType(DType::kBFloat16, MemoryTag::kOther).value();
  std::vector<float> leaf;
  Bf16Run kept = RunBf16(/*takes=*/true, {g16}, &leaf);
  EXPECT_EQ(kept.seen, DType::kBFloat16);
  EXPECT_THAT(kept.values, ElementsAre(0.5f, -3));
  EXPECT_THAT(leaf, ElementsAre(0.5f, -3));  // the leaf's gradient is fp32
  Bf16Run widened = RunBf16(/*takes=*/false, {g16}, &leaf);
  EXPECT_EQ(widened.seen, DType::kFloat32);
  EXPECT_THAT(widened.values, ElementsAre(0.5f, -3));
  // Two gradients for y: summed in fp32, whatever the node takes.
  Bf16Run summed = RunBf16(/*takes=*/true, {g16, Vec({1, 1})}, &leaf);
  EXPECT_EQ(summed.seen, DType::kFloat32);
  EXPECT_THAT(summed.values, ElementsAre(1.5f, -2));
}

TEST(AutogradTest, AddIntoAddsAndChecks) {
  Tensor a = Vec({1, 2});
  const uint64_t v = a.version();
  ASSERT_TRUE(AddInto(a, Vec({3, 4})).ok());
  EXPECT_THAT(a.ToVector(), ElementsAre(4, 6));
  EXPECT_GT(a.version(), v);
  EXPECT_EQ(AddInto(a, Vec({1})).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace core
