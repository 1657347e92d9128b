// CompareDataIdentity finds every differing key both ways and compares nothing when a
// side has no identity; a change reads with both values, a long one around its first
// difference.
#include "integration/checkpointing/data_identity.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace integration {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

TEST(DataIdentityTest, ListsEveryDifferingKeyInKeyOrder) {
  const std::map<std::string, std::string> saved = {{"data.fingerprint", "0x01"},
                                                    {"data.kind", "token_files"},
                                                    {"data.seed", "2"},
                                                    {"data.only_saved", "x"}};
  const std::map<std::string, std::string> current = {{"data.fingerprint", "0x02"},
                                                      {"data.kind", "token_files"},
                                                      {"data.seed", "3"},
                                                      {"data.only_current", "y"}};
  const DataIdentityComparison c = CompareDataIdentity(saved, current);
  EXPECT_TRUE(c.compared);
  EXPECT_EQ(c.note, "");
  ASSERT_EQ(c.changes.size(), 4u);
  EXPECT_EQ(c.changes[0].ToString(),
            "data.fingerprint: the checkpoint's 0x01 vs this module's 0x02");
  EXPECT_EQ(c.changes[1].ToString(),
            "data.only_current: the checkpoint's (none) vs this module's y");
  EXPECT_EQ(c.changes[2].ToString(), "data.only_saved: the checkpoint's x vs this module's (none)");
  EXPECT_EQ(c.changes[3].ToString(), "data.seed: the checkpoint's 2 vs this module's 3");
  EXPECT_THAT(CompareDataIdentity(saved, saved).changes, IsEmpty());
  EXPECT_TRUE(CompareDataIdentity(saved, saved).compared);
}

TEST(DataIdentityTest, ASideWithoutAnIdentityIsNotComparedAndSaysSo) {
  const std::map<std::string, std::string> some = {{"data.seed", "2"}};
  const DataIdentityComparison old_checkpoint = CompareDataIdentity({}, some);
  EXPECT_FALSE(old_checkpoint.compared);
  EXPECT_THAT(old_checkpoint.changes, IsEmpty());
  EXPECT_THAT(old_checkpoint.note, HasSubstr("the checkpoint records no data identity"));
  const DataIdentityComparison silent_module = CompareDataIdentity(some, {});
  EXPECT_FALSE(silent_module.compared);
  EXPECT_THAT(silent_module.note, HasSubstr("TrainModule::DataIdentity() is empty"));
  const DataIdentityComparison neither = CompareDataIdentity({}, {});
  EXPECT_FALSE(neither.compared);
  EXPECT_EQ(neither.note, "");
}

// NOTE [Data position]: compared key by key the same way; the notes name the position.
TEST(DataIdentityTest, PositionsCompareTheSameWayAndTheirNotesNameThePosition) {
  const std::map<std::string, std::string> saved = {{"data.epoch", "1"}, {"data.window", "48"}};
  const std::map<std::string, std::string> current = {{"data.epoch", "1"}, {"data.window", "96"}};
  const DataIdentityComparison c = CompareDataPosition(saved, current);
  EXPECT_TRUE(c.compared);
  ASSERT_EQ(c.changes.size(), 1u);
  EXPECT_EQ(c.changes[0].ToString(), "data.window: the checkpoint's 48 vs this module's 96");
  EXPECT_THAT(CompareDataPosition(saved, saved).changes, IsEmpty());
  EXPECT_THAT(CompareDataPosition({}, current).note,
              HasSubstr("the checkpoint records no data position"));
  EXPECT_THAT(CompareDataPosition(saved, {}).note,
              HasSubstr("TrainModule::DataPosition() is empty"));
  EXPECT_EQ(CompareDataPosition({}, {}).note, "");
}

TEST(DataIdentityTest, ALongValueIsShownAroundItsFirstDifference) {
  std::string files;
  for (int i = 0; i < 100; ++i) files += "/data/shard_" + std::to_string(1000 + i) + ".bin,";
  std::string moved = files;
  moved.replace(files.size() - 10, 4, "XXXX");
  const std::string text = DataIdentityChange{"data.files", files, moved}.ToString();
  EXPECT_THAT(text, HasSubstr("XXXX"));
  EXPECT_THAT(text, HasSubstr(".bin,")) << "the checkpoint's side around the same place";
  EXPECT_THAT(text, HasSubstr("(" + std::to_string(files.size()) + " characters)"));
  EXPECT_THAT(text, Not(HasSubstr("shard_1000"))) << "not from the start";
  EXPECT_LT(text.size(), 300u);
  EXPECT_EQ(DataIdentityChange({"data.files", "", "a"}).ToString(),
            "data.files: the checkpoint's '' vs this module's a");
}

}  // namespace
}  // namespace integration
