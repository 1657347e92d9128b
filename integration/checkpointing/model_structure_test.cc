// Tests of the model structure record: what it reads from known modules, that the
// fingerprint covers every field, and the order and wording of the differences.
#include "integration/checkpointing/model_structure.h"

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/gpt.h"

namespace integration {
namespace {

using ::testing::ElementsAre;

std::shared_ptr<nn::Gpt> MakeGpt(int64_t n_layer, int64_t n_head) {
  nn::GptConfig c;
  c.vocab_size = 16;
  c.block_size = 8;
  c.n_embd = 16;
  c.n_layer = n_layer;
  c.n_head = n_head;
  return nn::Gpt::Create(c).value();
}

std::vector<std::pair<std::string, core::Shape>> Shapes(const core::Module& m) {
  std::vector<std::pair<std::string, core::Shape>> out;
  for (const auto& [name, p] : m.NamedParameters()) out.emplace_back(name, p->data.shape());
  return out;
}

ModelStructure Describe(nn::Gpt& gpt, const std::map<std::string, std::string>& config = {}) {
  return DescribeModel(gpt, Shapes(gpt), config);
}

TEST(ModelStructureTest, RecordsEveryModuleWithItsKnownConfiguration) {
  auto gpt = MakeGpt(2, 4);
  const ModelStructure s = Describe(*gpt, {{"note", "x"}});
  ASSERT_EQ(s.modules_size(), static_cast<int>(gpt->NamedModules().size()));
  EXPECT_EQ(s.modules(0).path(), "");
  EXPECT_EQ(s.modules(0).type_name(), "Gpt");
  std::vector<std::string> root;
  for (const ConfigEntry& e : s.modules(0).config()) root.push_back(e.key() + "=" + e.value());
  EXPECT_THAT(root,
              ElementsAre("block_size=8", "n_embd=16", "n_head=4", "n_layer=2", "vocab_size=16"));
  bool attention = false;
  for (const ModuleRecord& m : s.modules()) {
    if (m.type_name() != "CausalSelfAttention") continue;
    attention = true;
    ASSERT_EQ(m.config_size(), 2);
    EXPECT_EQ(m.config(1).key(), "n_head");
    EXPECT_EQ(m.config(1).value(), "4");
  }
  EXPECT_TRUE(attention);
  EXPECT_EQ(s.parameters_size(), static_cast<int>(gpt->NamedParameters().size()));
  ASSERT_EQ(s.config_size(), 1);
  EXPECT_EQ(s.fingerprint(), StructureFingerprint(s));
  EXPECT_EQ(s.fingerprint().size(), 16u);
}

TEST(ModelStructureTest, FingerprintChangesWithEveryField) {
  auto gpt = MakeGpt(2, 4);
  const ModelStructure base = Describe(*gpt);
  std::set<std::string> seen = {base.fingerprint()};
  std::vector<ModelStructure> variants(6, base);
  variants[0].mutable_modules(1)->set_path("other");
  variants[1].mutable_modules(1)->set_type_name("Other");
  variants[2].mutable_modules(0)->mutable_config(0)->set_value("9");
  variants[3].mutable_parameters(0)->set_shape(0, 17);
  variants[4].mutable_parameters(0)->set_name("x");
  ConfigEntry* e = variants[5].add_config();
  e->set_key("k");
  e->set_value("v");
  for (const ModelStructure& v : variants) seen.insert(StructureFingerprint(v));
  EXPECT_EQ(seen.size(), variants.size() + 1) << "every change gives a new fingerprint";
  EXPECT_EQ(StructureFingerprint(base), base.fingerprint())
      << "the fingerprint field is not hashed";
}

TEST(ModelStructureTest, DifferencesComeConfigThenParametersThenModules) {
  auto two = MakeGpt(2, 4);
  auto one = MakeGpt(1, 2);
  const ModelStructure saved = Describe(*two, {{"n_layer", "2"}});
  const ModelStructure current = Describe(*one, {{"n_layer", "1"}});
  EXPECT_TRUE(StructureDifferences(saved, saved, true).empty());
  const std::vector<std::string> d = StructureDifferences(saved, current, true);
  ASSERT_GE(d.size(), 4u);
  EXPECT_EQ(d[0], "model_config n_layer: checkpoint 2, model 1");
  EXPECT_EQ(d[1], "checkpoint has tensor model/blocks.1.ln_1.weight that the model lacks");
  EXPECT_THAT(d, ::testing::Contains("module <root> (Gpt): n_head: checkpoint 4, model 2"));
  EXPECT_THAT(d, ::testing::Contains("module <root> (Gpt): n_layer: checkpoint 2, model 1"));
  EXPECT_THAT(d, ::testing::Contains(
                     "checkpoint has module 'blocks.1' (TransformerBlock) that the model lacks"));
  // Without compare_config the caller's map is ignored.
  EXPECT_NE(StructureDifferences(saved, current, false).front(), d[0]);
}

}  // namespace
}  // namespace integration
