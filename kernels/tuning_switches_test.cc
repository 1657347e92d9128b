#include "kernels/tuning_switches.h"

#include "gtest/gtest.h"

namespace kernels {
namespace {

TEST(TuningSwitchesTest, ATunerIsOffForZeroOnly) {
  EXPECT_TRUE(TuningSwitchOn(nullptr));
  EXPECT_TRUE(TuningSwitchOn(""));
  EXPECT_TRUE(TuningSwitchOn("1"));
  EXPECT_TRUE(TuningSwitchOn("00"));
  EXPECT_FALSE(TuningSwitchOn("0"));
}

TEST(TuningSwitchesTest, AttentionShapesAreTunedByDefault) {
  for (const char* shapes : {static_cast<const char*>(nullptr), "", "tuned"}) {
    for (const char* tuning : {static_cast<const char*>(nullptr), "", "1"}) {
      const absl::StatusOr<FlashShapePolicy> p = ParseFlashShapePolicy(shapes, tuning);
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_EQ(p->mode, FlashShapeMode::kTuned);
      EXPECT_EQ(p->switch_text, "");
    }
  }
}

TEST(TuningSwitchesTest, ReferenceRunsShapeZeroWhateverTheTuningSwitchSays) {
  for (const char* tuning : {static_cast<const char*>(nullptr), "0", "1"}) {
    const absl::StatusOr<FlashShapePolicy> p = ParseFlashShapePolicy("reference", tuning);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->mode, FlashShapeMode::kReference);
    EXPECT_EQ(p->switch_text, "FSDP_ATTENTION_SHAPES=reference");
  }
}

TEST(TuningSwitchesTest, TuningZeroTurnsTheAttentionTunerOff) {
  for (const char* shapes : {static_cast<const char*>(nullptr), "tuned"}) {
    const absl::StatusOr<FlashShapePolicy> p = ParseFlashShapePolicy(shapes, "0");
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->mode, FlashShapeMode::kUntuned);
    EXPECT_EQ(p->switch_text, "FSDP_ATTENTION_TUNING=0");
  }
}

TEST(TuningSwitchesTest, AnUnknownShapesValueIsInvalidArgumentNamingTheVariableAndValue) {
  for (const char* shapes : {"Reference", "0", "fast"}) {
    const absl::StatusOr<FlashShapePolicy> p = ParseFlashShapePolicy(shapes, nullptr);
    ASSERT_FALSE(p.ok()) << shapes;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(std::string("FSDP_ATTENTION_SHAPES=") + shapes),
              std::string::npos)
        << p.status();
  }
}

}  // namespace
}  // namespace kernels
