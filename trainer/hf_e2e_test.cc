// The main job from and to Hugging Face directories (NOTE [Hugging Face start] in
// trainer/internal/job_options.h), end to end with real processes at 2 ranks, on the
// committed transformers checkpoints (checkpoint/testdata/hf_gpt2, hf_llama):
//
//   --hf_dir, test only, --export_hf_dir -> the export holds the checkpoint's weights, bit
//                                            for bit: they went into the shards and back;
//   --hf_dir, fit 4 steps, --export_hf_dir -> the weights changed, the test loss fell, and
//                                            --hf_dir=<export> tests to the same loss bit
//                                            for bit;
//   --hf_dir with --resume_from          -> the checkpoint's weights, not config.json's;
//   --export_hf_dir without --hf_dir     -> config.json of the flags' sizes, the released
//                                            weights, the same test loss from --hf_dir;
//   a size flag against config.json      -> refused before any rank starts, naming both.
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/hf_gpt2.h"
#include "checkpoint/hf_llama.h"
#include "checkpoint/hf_model.h"
#include "checkpoint/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "trainer/testing/e2e_harness.h"

namespace integration {
namespace {

using testing::RunResult;
using testing::TempDir;

double Num(const nlohmann::json& j, const char* key) { return j.at(key).get<double>(); }

// The main job at 2 ranks writing into `out`: small batches and few evaluation batches,
// sequences of 16 tokens (the checkpoints' context is 32), no size flags; then `extra`.
RunResult Job(const std::string& out, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {testing::Runfile("trainer/main_job"),
                                   "--world_size=2",
                                   "--output_dir=" + out,
                                   "--seq_len=16",
                                   "--batch_size=8",
                                   "--eval_batch_size=8",
                                   "--eval_batches=2",
                                   "--log_every=10",
                                   "--warmup_steps=0",
                                   "--lr=1e-2",
                                   "--timeout_s=60"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return testing::RunRetryingPortRace(argv);
}

// The model in the Hugging Face directory `dir`, loaded plainly by our loader.
std::shared_ptr<core::Module> LoadPlain(const std::string& dir) {
  absl::StatusOr<checkpoint::HfModelType> type = checkpoint::ReadHfModelType(dir);
  EXPECT_TRUE(type.ok()) << type.status();
  if (!type.ok()) return nullptr;
  std::shared_ptr<core::Module> model;
  if (*type == checkpoint::HfModelType::kGpt2) {
    model = nn::Gpt::Create(checkpoint::ReadHfGpt2Config(dir).value()).value();
  } else {
    model = nn::Llama::Create(checkpoint::ReadHfLlamaConfig(dir).value()).value();
  }
  const absl::Status loaded = checkpoint::LoadHfModel(dir, *model, /*registry=*/nullptr);
  EXPECT_TRUE(loaded.ok()) << loaded;
  return loaded.ok() ? model : nullptr;
}

// How many of `a`'s parameters differ from `b`'s of the same name (names and shapes must
// match).
int DifferingParameters(const core::Module& a, const core::Module& b) {
  const auto pa = a.NamedParameters();
  const auto pb = b.NamedParameters();
  EXPECT_EQ(pa.size(), pb.size());
  int differing = 0;
  for (size_t i = 0; i < std::min(pa.size(), pb.size()); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first);
    EXPECT_EQ(pa[i].second->data.shape(), pb[i].second->data.shape()) << pa[i].first;
    if (pa[i].second->data.ToVector() != pb[i].second->data.ToVector()) ++differing;
  }
  return differing;
}

struct Family {
  const char* name;      // --model
  const char* testdata;  // the committed checkpoint
};

void PrintTo(const Family& family, std::ostream* os) { *os << family.name; }

class HfJobTest : public ::testing::TestWithParam<Family> {
 protected:
  std::string Dir(const std::string& name) const {
    return absl::StrCat(TempDir(), "/", GetParam().name, "_", name);
  }
  std::string Testdata() const { return testing::Runfile(GetParam().testdata); }
};

TEST_P(HfJobTest, StartsFromTheCheckpointAndItsExportReproducesTheReleasedModel) {
  const std::string original = Testdata();
  std::shared_ptr<core::Module> weights = LoadPlain(original);
  ASSERT_NE(weights, nullptr);

  // No training: the export is the checkpoint, bit for bit (into the shards and back).
  const std::string as_loaded = Dir("as_loaded");
  RunResult r0 = Job(
      as_loaded, {"--hf_dir=" + original, "--stages=test", "--export_hf_dir=" + as_loaded + "/hf"});
  ASSERT_EQ(r0.exit_code, 0) << r0.output;
  EXPECT_EQ(r0.summary["model"], GetParam().name);
  EXPECT_EQ(r0.summary["hf_dir"], original);
  EXPECT_EQ(r0.summary["export_hf_dir"], as_loaded + "/hf");
  EXPECT_TRUE(absl::StrContains(r0.output, "loaded Hugging Face checkpoint " + original))
      << r0.output;
  std::shared_ptr<core::Module> exported0 = LoadPlain(as_loaded + "/hf");
  ASSERT_NE(exported0, nullptr);
  EXPECT_EQ(DifferingParameters(*exported0, *weights), 0);

  // Four steps from the checkpoint: the stages reuse the load's wrap, the weights change,
  // the test loss falls.
  const std::string tuned = Dir("tuned");
  RunResult r1 = Job(tuned, {"--hf_dir=" + original, "--stages=fit,test", "--steps=4",
                             "--export_hf_dir=" + tuned + "/hf"});
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  EXPECT_EQ(r1.summary["fresh_wraps"], 1);
  EXPECT_EQ(r1.summary["global_step"], 4);
  EXPECT_LT(Num(r1.summary, "test_loss"), Num(r0.summary, "test_loss"));
  std::shared_ptr<core::Module> exported1 = LoadPlain(tuned + "/hf");
  ASSERT_NE(exported1, nullptr);
  EXPECT_EQ(DifferingParameters(*exported1, *weights),
            static_cast<int>(weights->NamedParameters().size()))
      << "every parameter trained";

  // The export, tested from --hf_dir at the same world size: the released model's
  // weights, so the trained run's test loss to the last bit.
  RunResult r2 =
      Job(Dir("retest"), {"--hf_dir=" + tuned + "/hf", "--stages=test", "--release=false"});
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  EXPECT_EQ(Num(r2.summary, "test_loss"), Num(r1.summary, "test_loss"));
  EXPECT_NEAR(Num(r1.summary, "released_test_loss"), Num(r1.summary, "test_loss"),
              1e-6 * Num(r1.summary, "test_loss"));

  // --hf_dir with --resume_from: config.json's model, the checkpoint's weights.
  RunResult r3 = Job(Dir("resumed"), {"--hf_dir=" + original, "--stages=test",
                                      "--resume_from=" + tuned + "/checkpoint", "--release=false"});
  ASSERT_EQ(r3.exit_code, 0) << r3.output;
  EXPECT_EQ(r3.summary["resumed_step"], 4);
  EXPECT_EQ(Num(r3.summary, "test_loss"), Num(r1.summary, "test_loss"));
  EXPECT_FALSE(absl::StrContains(r3.output, "loaded Hugging Face checkpoint")) << r3.output;
}

// --export_hf_dir without --hf_dir: config.json from the flags' sizes, the released weights
// (those of model.safetensors), and --hf_dir of it tests to the run's own loss.
TEST_P(HfJobTest, ExportsARunThatDidNotStartFromACheckpoint) {
  const std::string out = Dir("from_flags");
  RunResult r =
      testing::MainJob(2, out,
                       {std::string("--model=") + GetParam().name, "--stages=fit,test", "--steps=2",
                        "--eval_batches=2", "--export_hf_dir=" + out + "/hf"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(r.summary["hf_dir"].is_null());
  EXPECT_EQ(r.summary["export_hf_dir"], out + "/hf");
  std::shared_ptr<core::Module> exported = LoadPlain(out + "/hf");
  ASSERT_NE(exported, nullptr);
  // SmallModelFlags' sizes: vocabulary 32, width 32, 2 blocks; 16 positions.
  if (std::string(GetParam().name) == "gpt") {
    const nn::GptConfig c = checkpoint::ReadHfGpt2Config(out + "/hf").value();
    EXPECT_EQ(c.vocab_size, 32);
    EXPECT_EQ(c.n_embd, 32);
    EXPECT_EQ(c.n_layer, 2);
    EXPECT_EQ(c.block_size, 16);
  } else {
    const nn::LlamaConfig c = checkpoint::ReadHfLlamaConfig(out + "/hf").value();
    EXPECT_EQ(c.vocab_size, 32);
    EXPECT_EQ(c.hidden_size, 32);
    EXPECT_EQ(c.num_hidden_layers, 2);
    EXPECT_EQ(c.max_position_embeddings, 16);
  }
  absl::StatusOr<checkpoint::SafetensorsFile> released =
      checkpoint::ImportSafetensors(out + "/model.safetensors");
  ASSERT_TRUE(released.ok()) << released.status();
  for (const auto& [name, parameter] : exported->NamedParameters()) {
    const core::Tensor* t = released->Find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->ToVector(), parameter->data.ToVector()) << name;
  }
  RunResult again = Job(Dir("from_flags_retest"), {"--hf_dir=" + out + "/hf", "--stages=test",
                                                   "--eval_batches=2", "--release=false"});
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(Num(again.summary, "test_loss"), Num(r.summary, "test_loss"));
}

TEST_P(HfJobTest, ASizeFlagAgainstConfigJsonIsRefusedBeforeAnyRankStarts) {
  RunResult r = Job(Dir("conflict"), {"--hf_dir=" + Testdata(), "--n_layer=3"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(
      absl::StrContains(r.output, "--n_layer=3 disagrees with " + Testdata() + "/config.json: "))
      << r.output;
  EXPECT_FALSE(absl::StrContains(r.output, "starting 2 local ranks")) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Families, HfJobTest,
                         ::testing::Values(Family{"gpt", "checkpoint/testdata/hf_gpt2"},
                                           Family{"llama", "checkpoint/testdata/hf_llama"}),
                         [](const ::testing::TestParamInfo<Family>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace integration
