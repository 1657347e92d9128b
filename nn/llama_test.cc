#include "nn/llama.h"

#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/op_profile.h"
#include "core/param_init.h"
#include "core/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/losses.h"
#include "nn/testing/fused_layers.h"
#include "nn/testing/gradcheck.h"
#include "nn/to_device.h"

namespace nn {
namespace {

using gradcheck::RandomTokens;
using ::testing::HasSubstr;

std::shared_ptr<Llama> MakeLlama(const LlamaConfig& config) {
  absl::StatusOr<std::shared_ptr<Llama>> llama = Llama::Create(config);
  EXPECT_TRUE(llama.ok()) << llama.status();
  return llama.ok() ? *llama : nullptr;
}

// 2 layers, 4 query heads sharing 2 kv heads of width 4.
LlamaConfig Tiny() {
  LlamaConfig c;
  c.vocab_size = 11;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 8;
  c.seed = 3;
  return c;
}

// Every parameter gradient of `m`, in NamedParameters order.
std::vector<std::vector<float>> Grads(core::Module& m) {
  std::vector<std::vector<float>> out;
  for (const auto& [name, p] : m.NamedParameters()) out.push_back(p->grad.ToVector());
  return out;
}

TEST(LlamaConfigTest, ValidateNamesTheField) {
  EXPECT_TRUE(LlamaConfig().Validate().ok());
  EXPECT_TRUE(Tiny().Validate().ok());
  using Set = std::function<void(LlamaConfig*)>;
  for (const auto& [field, set] : std::vector<std::pair<std::string, Set>>{
           {"vocab_size", [](LlamaConfig* c) { c->vocab_size = 0; }},
           {"hidden_size", [](LlamaConfig* c) { c->hidden_size = -4; }},
           {"intermediate_size", [](LlamaConfig* c) { c->intermediate_size = 0; }},
           {"num_hidden_layers", [](LlamaConfig* c) { c->num_hidden_layers = 0; }},
           {"num_attention_heads", [](LlamaConfig* c) { c->num_attention_heads = 0; }},
           {"num_key_value_heads", [](LlamaConfig* c) { c->num_key_value_heads = 0; }},
           {"max_position_embeddings", [](LlamaConfig* c) { c->max_position_embeddings = 0; }},
           {"hidden_size", [](LlamaConfig* c) { c->num_attention_heads = 3; }},
           {"hidden_size", [](LlamaConfig* c) { c->num_attention_heads = 64; }},  // width 1: odd
           {"num_key_value_heads", [](LlamaConfig* c) { c->num_key_value_heads = 3; }},
           {"rms_norm_eps", [](LlamaConfig* c) { c->rms_norm_eps = -1.0f; }},
           {"rope_theta", [](LlamaConfig* c) { c->rope_theta = 0.0; }},
           {"rope_theta", [](LlamaConfig* c) { c->rope_theta = NAN; }},
           {"initializer_range", [](LlamaConfig* c) { c->initializer_range = -0.02f; }}}) {
    LlamaConfig c;
    set(&c);
    const absl::Status v = c.Validate();
    EXPECT_EQ(v.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(std::string(v.message()), HasSubstr("LlamaConfig." + field));
    absl::StatusOr<std::shared_ptr<Llama>> llama = Llama::Create(c);
    EXPECT_EQ(llama.status(), v);
  }
}

TEST(LlamaTest, ModelsThatCannotBeAllocatedAreResourceExhausted) {
  LlamaConfig overflow;
  overflow.vocab_size = int64_t{1} << 60;
  overflow.hidden_size = int64_t{1} << 20;
  absl::StatusOr<std::shared_ptr<Llama>> llama = Llama::Create(overflow);
  EXPECT_EQ(llama.status().code(), absl::StatusCode::kResourceExhausted) << llama.status();
  EXPECT_THAT(std::string(llama.status().message()), HasSubstr("overflows int64"));
  // A CPU allocator with a 1 MiB limit refuses a 64M-float embedding, naming it.
  auto small = std::make_shared<core::Allocator>(core::Device::Cpu());
  small->SetLimit(1 << 20);
  core::ScopedAllocator scope(small);
  LlamaConfig big;
  big.vocab_size = 1 << 20;
  llama = Llama::Create(big);
  EXPECT_EQ(llama.status().code(), absl::StatusCode::kResourceExhausted) << llama.status();
  EXPECT_THAT(std::string(llama.status().message()), HasSubstr("embed_tokens"));
}

TEST(LlamaTest, ParameterNamesFollowHuggingFaceWithoutTheModelPrefix) {
  for (bool tied : {false, true}) {
    LlamaConfig c = Tiny();
    c.tie_word_embeddings = tied;
    std::shared_ptr<Llama> llama = MakeLlama(c);
    ASSERT_NE(llama, nullptr);
    std::vector<std::string> names;
    for (const auto& [name, p] : llama->NamedParameters()) names.push_back(name);
    std::vector<std::string> expected = {"embed_tokens.weight"};
    for (int l = 0; l < 2; ++l) {
      const std::string b = "layers." + std::to_string(l) + ".";
      for (const char* n :
           {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
            "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
            "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"}) {
        expected.push_back(b + n);
      }
    }
    expected.push_back("norm.weight");
    if (!tied) expected.push_back("lm_head.weight");
    EXPECT_EQ(names, expected);
    EXPECT_EQ(llama->lm_head()->weight() == llama->embed_tokens()->weight(), tied);
    EXPECT_EQ(llama->lm_head()->bias(), nullptr);
    std::vector<std::string> children;
    for (const auto& [name, m] : llama->NamedChildren()) children.push_back(name);
    EXPECT_EQ(children, (std::vector<std::string>{"embed_tokens", "layers", "norm", "lm_head"}));
    EXPECT_EQ(llama->layers()->modules()[0]->TypeName(), "LlamaDecoderLayer");
    // One set of rotary tables for every layer.
    auto attn = [&](int l) {
      return static_cast<LlamaDecoderLayer&>(*llama->layers()->modules()[l]).self_attn();
    };
    EXPECT_EQ(attn(0)->rotary_tables(), attn(1)->rotary_tables());
    EXPECT_EQ(llama->TypeName(), "Llama");
    // V C (+ V C untied) + L (2 C + C^2 + 2 C (KV D) + C^2 + 3 C I) + C, with C 16, KV D 8, I 24.
    const int64_t layer = 2 * 16 + 16 * 16 + 2 * 16 * 8 + 16 * 16 + 3 * 16 * 24;
    EXPECT_EQ(llama->NumParameterElements(), 11 * 16 * (tied ? 1 : 2) + 2 * layer + 16);
  }
}

TEST(LlamaTest, InitFollowsHuggingFaceAndIsDeterministicPerSeed) {
  LlamaConfig c;  // the default: 64 wide, 2 layers
  c.seed = 11;
  std::shared_ptr<Llama> a = MakeLlama(c), b = MakeLlama(c);
  c.seed = 12;
  std::shared_ptr<Llama> other = MakeLlama(c);
  const auto pa = a->NamedParameters(), pb = b->NamedParameters(), po = other->NamedParameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    const std::string& name = pa[i].first;
    const std::vector<float> v = pa[i].second->data.ToVector();
    EXPECT_EQ(v, pb[i].second->data.ToVector()) << name;
    if (name.find("norm") != std::string::npos) {
      for (float x : v) ASSERT_EQ(x, 1.0f) << name;
    } else {
      EXPECT_NE(v, po[i].second->data.ToVector()) << name;
      // N(0, 0.02): the sample std of n >= 2048 draws is within 8% (5 sigma).
      EXPECT_NEAR(gradcheck::StdDev(v), 0.02, 0.08 * 0.02) << name;
    }
  }
  // Layers and projections draw from their own streams.
  const auto& layers = a->layers()->modules();
  EXPECT_NE(layers[0]->NamedParameters()[1].second->data.ToVector(),
            layers[1]->NamedParameters()[1].second->data.ToVector());
}

// NOTE [Deferred initialisation]: built under a DeferredInitScope the model holds no
// parameter memory and refuses to run; each recipe fills the bits the eager model holds.
TEST(LlamaTest, DeferredInitRecipesGiveTheEagerBits) {
  for (bool tied : {false, true}) {
    LlamaConfig c = Tiny();
    c.tie_word_embeddings = tied;
    std::shared_ptr<Llama> eager = MakeLlama(c), deferred;
    core::Allocator& cpu = *core::Allocator::Current(core::Device::Cpu());
    const int64_t params_before = cpu.Stats().current(core::MemoryTag::kParam);
    {
      core::DeferredInitScope scope;
      deferred = MakeLlama(c);
    }
    ASSERT_NE(deferred, nullptr);
    EXPECT_EQ(cpu.Stats().current(core::MemoryTag::kParam), params_before);
    const auto pe = eager->NamedParameters(), pd = deferred->NamedParameters();
    ASSERT_EQ(pe.size(), pd.size());
    for (size_t i = 0; i < pe.size(); ++i) {
      ASSERT_TRUE(pd[i].second->deferred()) << pd[i].first;
      ASSERT_NE(pd[i].second->init, nullptr) << pd[i].first;
      core::Tensor filled = core::Tensor::Zeros(pd[i].second->data.shape());
      ASSERT_TRUE(pd[i].second->init->Fill(filled, 0).ok());
      EXPECT_EQ(filled.ToVector(), pe[i].second->data.ToVector()) << pd[i].first;
    }
    absl::StatusOr<core::Tensor> y = deferred->Forward(RandomTokens(1, 4, c.vocab_size, 1));
    EXPECT_EQ(y.status().code(), absl::StatusCode::kFailedPrecondition) << y.status();
    EXPECT_THAT(std::string(y.status().message()), HasSubstr("not materialized"));
  }
}

TEST(LlamaTest, ForwardShapesAndCausality) {
  std::shared_ptr<Llama> llama = MakeLlama(Tiny());
  ASSERT_NE(llama, nullptr);
  gradcheck::RandomizeParameters(*llama, 2, 0.0f, 0.3f);
  const int64_t V = 11, T = 6;
  core::Tensor tokens = RandomTokens(2, T, V, 1);
  absl::StatusOr<core::Tensor> logits = llama->Forward(tokens);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_EQ(logits->shape(), (core::Shape{2, T, V}));
  const std::vector<float> before = logits->ToVector();
  // Change the last two tokens of sequence 0: logits at t <= 3 must not move.
  for (int t = 4; t < T; ++t) {
    int32_t& id = tokens.data<int32_t>()[t];
    id = (id + 1) % V;
  }
  const std::vector<float> after = llama->Forward(tokens).value().ToVector();
  for (int t = 0; t < T; ++t) {
    bool same = true;
    for (int v = 0; v < V; ++v) same &= after[t * V + v] == before[t * V + v];
    EXPECT_EQ(same, t <= 3) << "t=" << t;
  }
  for (int64_t i = T * V; i < 2 * T * V; ++i) EXPECT_EQ(after[i], before[i]);  // sequence 1
}

TEST(LlamaTest, DecoderLayerBackwardMatchesFiniteDifferences) {
  LlamaDecoderLayer layer(Tiny(), 5);
  gradcheck::RandomizeParameters(layer, 6, 0.0f, 0.4f);
  absl::StatusOr<gradcheck::Report> r =
      gradcheck::CheckModule(layer, gradcheck::RandomTensor({2, 5, 16}, 7), {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_EQ(r->num_checked, 2 * 5 * 16 + layer.NumParameterElements());
  EXPECT_GT(r->max_abs_numeric, 0.5);
}

TEST(LlamaTest, BackwardMatchesFiniteDifferences) {
  for (bool tied : {false, true}) {
    LlamaConfig c = Tiny();
    c.tie_word_embeddings = tied;
    std::shared_ptr<Llama> llama = MakeLlama(c);
    ASSERT_NE(llama, nullptr);
    // Weights N(0, 0.3) rather than 0.02, so gradients below the head are O(0.1..1) (see
    // GptTest.BackwardMatchesFiniteDifferences).
    gradcheck::RandomizeParameters(*llama, 9, 0.0f, 0.3f);
    absl::StatusOr<gradcheck::Report> r =
        gradcheck::CheckModule(*llama, RandomTokens(2, 5, c.vocab_size, 2), {});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->ok()) << r->ToString();
    EXPECT_EQ(r->num_checked, llama->NumParameterElements());
    EXPECT_GT(r->max_abs_numeric, 0.5);
  }
}

// NOTE [Activation checkpointing] (core/module.h): a checkpointed decoder layer, alone or
// as every layer of the model, gives the plain run's gradients bit for bit, and the model
// holds fewer activation bytes after its forward.
TEST(LlamaTest, CheckpointedLayersGiveThePlainGradientsBitForBit) {
  {
    LlamaDecoderLayer plain(Tiny(), 4), checkpointed(Tiny(), 4);
    checkpointed.set_checkpoint_activations(true);
    const core::Tensor x = gradcheck::RandomTensor({2, 6, 16}, 1);
    const core::Tensor g = gradcheck::RandomTensor({2, 6, 16}, 2);
    std::vector<std::vector<float>> out[2];
    int k = 0;
    for (LlamaDecoderLayer* m : {&plain, &checkpointed}) {
      absl::StatusOr<core::Tensor> y = m->Forward(x);
      ASSERT_TRUE(y.ok()) << y.status();
      absl::StatusOr<core::Tensor> gx = m->Backward(g);
      ASSERT_TRUE(gx.ok()) << gx.status();
      out[k] = Grads(*m);
      out[k].push_back(y->ToVector());
      out[k].push_back(gx->ToVector());
      ++k;
    }
    EXPECT_EQ(out[1], out[0]);
  }
  const LlamaConfig c = Tiny();
  std::shared_ptr<Llama> plain = MakeLlama(c), checkpointed = MakeLlama(c);
  for (const auto& layer : checkpointed->layers()->modules()) {
    layer->set_checkpoint_activations(true);
  }
  const core::Tensor tokens = RandomTokens(3, 8, c.vocab_size, 3);
  const core::Tensor targets = RandomTokens(3, 8, c.vocab_size, 4);
  core::Allocator& cpu = *core::Allocator::Current(core::Device::Cpu());
  std::vector<std::vector<float>> grads[2];
  int64_t held[2] = {0, 0};
  int k = 0;
  for (const std::shared_ptr<Llama>& model : {plain, checkpointed}) {
    const int64_t before = cpu.Stats().current(core::MemoryTag::kActivation);
    absl::StatusOr<core::Tensor> logits = model->Forward(tokens);
    ASSERT_TRUE(logits.ok()) << logits.status();
    held[k] = cpu.Stats().current(core::MemoryTag::kActivation) - before;
    absl::StatusOr<LossResult> loss = CrossEntropyLoss(*logits, targets);
    ASSERT_TRUE(loss.ok()) << loss.status();
    ASSERT_TRUE(model->Backward(loss->grad).ok());
    grads[k++] = Grads(*model);
  }
  EXPECT_EQ(grads[1], grads[0]);
  EXPECT_LT(held[1], held[0]);
}

// bf16 weights (FSDP mixed precision): the head wants the logits' gradient in bf16, and a
// loss that writes it so gives every parameter gradient of the fp32 gradient bit for bit
// (GptTest.Bf16LogitsGradientGivesTheBitsOfTheFp32One); the loss stays near the fp32 one.
TEST(LlamaTest, Bf16WeightsTrainLikeGpt) {
  LlamaConfig c = Tiny();
  std::shared_ptr<Llama> ref = MakeLlama(c), a = MakeLlama(c), b = MakeLlama(c);
  const core::Tensor tokens = RandomTokens(2, 6, c.vocab_size, 8);
  const core::Tensor targets = RandomTokens(2, 6, c.vocab_size, 9);
  absl::StatusOr<core::Tensor> l32 = ref->Forward(tokens);
  ASSERT_TRUE(l32.ok()) << l32.status();
  EXPECT_EQ(ref->logits_grad_dtype(), core::DType::kFloat32);
  const float loss32 = CrossEntropyLoss(*l32, targets).value().loss;
  std::vector<float> losses;
  for (Llama* m : {a.get(), b.get()}) {
    ASSERT_TRUE(ConvertParameters(*m, core::DType::kBFloat16).ok());
    absl::StatusOr<core::Tensor> l = m->Forward(tokens);
    ASSERT_TRUE(l.ok()) << l.status();
    EXPECT_EQ(m->logits_grad_dtype(), core::DType::kBFloat16);
    const core::DType want = m == a.get() ? core::DType::kFloat32 : m->logits_grad_dtype();
    absl::StatusOr<LossResult> r = CrossEntropyLoss(*l, targets, want);
    ASSERT_TRUE(r.ok()) << r.status();
    losses.push_back(r->loss);
    ASSERT_TRUE(m->Backward(r->grad).ok());
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_NEAR(losses[0], loss32, 1e-2);
  EXPECT_EQ(Grads(*a), Grads(*b));
}

// NOTE [GEMM epilogues]: under bf16 weights each RMSNorm whose output goes straight into
// bf16 GEMMs (input_layernorm into q, k, v; post_attention_layernorm into gate and up; the
// final norm into lm_head) stores it bf16 itself, one rounding pass fewer each. A hook on
// the norm makes it write fp32, rounded by the layer after it: the same bits (outputs,
// input gradient, every parameter gradient).
TEST(LlamaTest, Bf16NormsStoreTheirOutputsForTheGemmsThatTakeThem) {
  const LlamaConfig c = Tiny();
  LlamaDecoderLayer layer(c, 4);
  ASSERT_TRUE(ConvertParameters(layer, core::DType::kBFloat16).ok());
  const core::Tensor x = gradcheck::RandomTensor({2, 6, 16}, 1);
  const core::Tensor g = gradcheck::RandomTensor({2, 6, 16}, 2);
  for (RmsNorm* norm : {layer.input_layernorm().get(), layer.post_attention_layernorm().get()}) {
    SCOPED_TRACE(norm->Path());
    const fused_layers::HookComparison cmp =
        fused_layers::ExpectSameBitsWithHookOn(layer, *norm, x, g);
    EXPECT_EQ(cmp.hooked_cost.converts - cmp.plain_cost.converts, 1);
  }
  // The final norm into the head: the logits' bits, one conversion fewer.
  std::shared_ptr<Llama> llama = MakeLlama(c);
  ASSERT_TRUE(ConvertParameters(*llama, core::DType::kBFloat16).ok());
  const core::Tensor tokens = RandomTokens(2, 6, c.vocab_size, 5);
  auto logits = [&]() {
    absl::StatusOr<core::Tensor> y = llama->Forward(tokens);
    EXPECT_TRUE(y.ok()) << y.status();
    std::vector<float> v = y.ok() ? y->ToVector() : std::vector<float>();
    llama->DropActivations();
    return v;
  };
  const int plain_converts = fused_layers::MeasureForward(*llama, tokens).converts;
  const std::vector<float> plain = logits();
  int calls = 0;
  core::HookHandle h = fused_layers::CountingHook(*llama->norm(), &calls);
  EXPECT_EQ(fused_layers::MeasureForward(*llama, tokens).converts - plain_converts, 1);
  EXPECT_EQ(logits(), plain);
  EXPECT_EQ(calls, 2);
}

// The ops one Backward(g) of `m` records after a Forward(x) (outside the profile): how many
// residual adds ("add") and bf16 roundings ("convert") of their own, and how many fused
// RMSNorm backward + residual ops.
struct BackwardOps {
  int adds = 0, converts = 0, norm_adds = 0;
};
BackwardOps CountBackwardOps(core::Module& m, const core::Tensor& x, const core::Tensor& g) {
  BackwardOps n;
  EXPECT_TRUE(m.Forward(x).ok());
  core::OpProfile profile;
  {
    core::ScopedOpProfile on(&profile);
    EXPECT_TRUE(m.Backward(g).ok());
  }
  for (const core::OpRecord& r : profile.records()) {
    n.adds += r.name == "add" || r.name == "grad.add";  // a residual's, or the graph's sum
    n.converts += r.name == "convert";
    n.norm_adds += r.name == "rmsnorm.backward_add";
  }
  return n;
}

// NOTE [Block forwards]: each RmsNorm's backward adds the residual gradient in its own pass
// (nn::RmsNormBackwardAdd: two adds fewer per layer), and under bf16 weights
// post_attention_layernorm's also writes the bf16 copy of the sum that o_proj's GEMMs take
// (o_proj's rounding pass gone). A hook on a norm makes the layer run the norm's Backward,
// add, and let o_proj round: the same bits (output, input gradient, every parameter
// gradient).
TEST(LlamaTest, NormBackwardsAddTheResidualGradientAndRoundItForOProj) {
  const LlamaConfig c = Tiny();
  const core::Tensor x = gradcheck::RandomTensor({2, 6, 16}, 1);
  const core::Tensor g = gradcheck::RandomTensor({2, 6, 16}, 2);
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 weights" : "fp32 weights");
    LlamaDecoderLayer layer(c, 4);
    if (bf16) {
      ASSERT_TRUE(ConvertParameters(layer, core::DType::kBFloat16).ok());
    }
    for (RmsNorm* norm : {layer.input_layernorm().get(), layer.post_attention_layernorm().get()}) {
      SCOPED_TRACE(norm->Path());
      fused_layers::ExpectSameBitsWithHookOn(layer, *norm, x, g);
    }
    const BackwardOps fused = CountBackwardOps(layer, x, g);
    int calls = 0;
    core::HookHandle h1 = fused_layers::CountingHook(*layer.input_layernorm(), &calls);
    core::HookHandle h2 = fused_layers::CountingHook(*layer.post_attention_layernorm(), &calls);
    const BackwardOps unfused = CountBackwardOps(layer, x, g);
    EXPECT_EQ(calls, 2);
    EXPECT_EQ(fused.norm_adds, 2);
    EXPECT_EQ(unfused.norm_adds, 0);
    EXPECT_EQ(unfused.adds - fused.adds, 2);
    EXPECT_EQ(unfused.converts - fused.converts, bf16 ? 1 : 0);
  }
}

// Under bf16 weights the sublayers take a bf16 input (what their GEMMs round an fp32 one to), with
// the bits of its fp32 widening, with or without a hook on a projection; under fp32 weights a bf16
// input is refused, naming the sublayer.
TEST(LlamaTest, Bf16InputsOnlyUnderBf16Weights) {
  const LlamaConfig c = Tiny();
  const core::Tensor x16 = gradcheck::RandomTensor({2, 6, 16}, 1)
                               .ToDType(core::DType::kBFloat16, core::MemoryTag::kOther)
                               .value();
  const core::Tensor x32 = x16.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value();
  LlamaDecoderLayer layer(c, 4);
  ASSERT_TRUE(ConvertParameters(layer, core::DType::kBFloat16).ok());
  std::vector<core::Module*> sublayers = {layer.self_attn().get(), layer.mlp().get()};
  for (bool hooked : {false, true}) {
    int calls = 0;
    core::HookHandle hq, hu;
    if (hooked) {
      hq = fused_layers::CountingHook(*layer.self_attn()->q_proj(), &calls);
      hu = fused_layers::CountingHook(*layer.mlp()->up_proj(), &calls);
    }
    for (core::Module* m : sublayers) {
      SCOPED_TRACE(absl::StrCat(m->Path(), hooked ? " hooked" : ""));
      absl::StatusOr<core::Tensor> from16 = m->Forward(x16);
      absl::StatusOr<core::Tensor> from32 = m->Forward(x32);
      ASSERT_TRUE(from16.ok() && from32.ok()) << from16.status() << from32.status();
      EXPECT_EQ(from16->ToVector(), from32->ToVector());
    }
    layer.DropActivations();
    EXPECT_EQ(calls, hooked ? 4 : 0);
  }
  LlamaDecoderLayer fp32(c, 4);
  for (core::Module* m : {static_cast<core::Module*>(fp32.self_attn().get()),
                          static_cast<core::Module*>(fp32.mlp().get())}) {
    absl::StatusOr<core::Tensor> y = m->Forward(x16);
    EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument) << m->Path();
    EXPECT_THAT(std::string(y.status().message()), HasSubstr(m->Path())) << y.status();
    EXPECT_THAT(std::string(y.status().message()), HasSubstr("float32")) << y.status();
  }
}

TEST(LlamaTest, BadInputsNameTheModuleAndOption) {
  std::shared_ptr<Llama> llama = MakeLlama(Tiny());
  ASSERT_NE(llama, nullptr);
  absl::StatusOr<core::Tensor> y = llama->Forward(RandomTokens(1, 9, 11, 1));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("<root> (Llama)"));
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("max_position_embeddings 8"));
  y = llama->Forward(core::Tensor::FromInts({1, 11}, {1, 2}).value());
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("embed_tokens (Embedding)"));
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("id 11"));
  y = llama->Forward(core::Tensor::FromInts({1, 2}, {2}).value());
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("[B, T]"));
  EXPECT_EQ(llama->Backward(core::Tensor::Zeros({1, 2, 11})).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// NOTE [Block forwards] (nn/transformer.h): the decoder layer's two residual adds ride in
// o_proj's and down_proj's GEMMs, and the input gradients of the projections that share an
// input (k and v after q, up after gate) add in theirs. A hook on any of them makes the layer
// call its sublayer (self_attn or mlp) and add the residual in a pass of its own; one on k, v or
// up also makes the sublayer call the projections that share the input, whose gradients the
// engine then sums. The same bits either way.
TEST(LlamaTest, ResidualsAndSharedInputGradientsAddInTheGemms) {
  const LlamaConfig c = Tiny();
  for (core::DType dtype : {core::DType::kFloat32, core::DType::kBFloat16}) {
    SCOPED_TRACE(core::DTypeName(dtype));
    LlamaDecoderLayer layer(c, 4);
    ASSERT_TRUE(ConvertParameters(layer, dtype).ok());
    const core::Tensor x = gradcheck::RandomTensor({2, 6, 16}, 1);
    const core::Tensor g = gradcheck::RandomTensor({2, 6, 16}, 2);
    const GroupedQueryAttention& attn = *layer.self_attn();
    const SwiGluMlp& mlp = *layer.mlp();
    for (Linear* linear : {attn.o_proj().get(), mlp.down_proj().get(), attn.k_proj().get(),
                           attn.v_proj().get(), mlp.up_proj().get()}) {
      SCOPED_TRACE(linear->Path());
      const fused_layers::HookComparison cmp =
          fused_layers::ExpectSameBitsWithHookOn(layer, *linear, x, g);
      // "binary.add": the residual of a called sublayer (F::Add); "add": inside one.
      EXPECT_EQ(cmp.MoreOpsWithHook("binary.add"), 1);
      // The engine's sums of a shared input's gradients: q's, k's and v's, or gate's and up's.
      const int sums = linear == attn.k_proj().get() || linear == attn.v_proj().get() ? 2
                       : linear == mlp.up_proj().get()                                ? 1
                                                                                      : 0;
      EXPECT_EQ(cmp.MoreOpsWithHook("grad.add"), sums);
    }
  }
}

}  // namespace
}  // namespace nn
