// Keeps README.md and the guides true to the code. Every fenced block of one follows a marker
// that says where it comes from:
//   <!-- from: PATH -->    the block's lines appear in PATH, contiguous and in order (each line
//                          compared without its leading and trailing whitespace, so the guide
//                          may unindent), and PATH is compiled and run by a test (a source of
//                          a tested target, or a test itself);
//   <!-- run by: PATH -->  PATH is a test that reads the guide and runs the block (it must
//                          name the guide);
//   <!-- output of: PATH --> the block is what a command prints, and PATH is a test that reads
//                          the guide and checks its output against the block (it must name
//                          the guide).
// A block without a marker, a PATH that is not in this test's data, or a block the file does
// not hold fails, naming the guide's line. Every relative link of README.md and docs/*.md
// ("[text](path)", "#anchor" aside) must name a file in this test's data.
//   bazel test //docs:guide_snippets_test
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"

namespace {

const char* const kGuides[] = {
    "README.md",           "docs/BUILDING.md", "docs/CHECKPOINTS.md", "docs/CLUSTERS.md",
    "docs/DATA.md",        "docs/GPUS.md",     "docs/MEMORY.md",      "docs/MODELS.md",
    "docs/PERFORMANCE.md", "docs/POLICIES.md", "docs/STAGES.md",
};

// The documents whose links are checked: the guides and the design notes.
const char* const kLinkedDocs[] = {"docs/DESIGN.md", "docs/GPU_RUNS.md"};

bool ReadLines(const std::string& path, std::vector<std::string>* lines) {
  std::ifstream in(path);
  if (!in) return false;
  std::string line;
  while (std::getline(in, line)) lines->push_back(line);
  return true;
}

std::string Stripped(const std::string& line) {
  return std::string(absl::StripAsciiWhitespace(line));
}

// Whether `block` (stripped lines) appears contiguously in `file` (stripped the same way).
bool Contains(const std::vector<std::string>& file, const std::vector<std::string>& block) {
  if (block.empty()) return false;
  for (size_t start = 0; start + block.size() <= file.size(); ++start) {
    bool all = true;
    for (size_t i = 0; i < block.size() && all; ++i) all = Stripped(file[start + i]) == block[i];
    if (all) return true;
  }
  return false;
}

// The marker's path, or "" when `line` is not a marker of `kind` ("from", "run by").
std::string MarkerPath(const std::string& line, const std::string& kind) {
  const std::string stripped = Stripped(line);
  absl::string_view rest = stripped;
  if (!absl::ConsumePrefix(&rest, "<!-- " + kind + ":") || !absl::ConsumeSuffix(&rest, "-->")) {
    return "";
  }
  return std::string(absl::StripAsciiWhitespace(rest));
}

void CheckGuide(const std::string& guide) {
  std::vector<std::string> lines;
  ASSERT_TRUE(ReadLines(guide, &lines)) << guide << ": not in the test's data";
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!absl::StartsWith(Stripped(lines[i]), "```")) continue;
    const size_t open = i;
    std::vector<std::string> block;
    for (++i; i < lines.size() && !absl::StartsWith(Stripped(lines[i]), "```"); ++i) {
      block.push_back(Stripped(lines[i]));
    }
    const std::string where = absl::StrCat(guide, ":", open + 1);
    const std::string marker = open > 0 ? lines[open - 1] : "";
    const std::string from = MarkerPath(marker, "from");
    std::string run_by = MarkerPath(marker, "run by");
    if (run_by.empty()) run_by = MarkerPath(marker, "output of");
    if (!from.empty()) {
      std::vector<std::string> file;
      if (!ReadLines(from, &file)) {
        ADD_FAILURE() << where << ": " << from << " is not in //docs:guide_snippets_test's data";
        continue;
      }
      EXPECT_TRUE(Contains(file, block))
          << where << ": the block is not in " << from
          << " (the code changed: copy the current lines into the guide)";
    } else if (!run_by.empty()) {
      std::ifstream in(run_by);
      std::stringstream text;
      text << in.rdbuf();
      EXPECT_TRUE(in.good() || in.eof()) << where << ": " << run_by << " is not in the data";
      EXPECT_TRUE(absl::StrContains(text.str(), guide))
          << where << ": " << run_by << " does not read " << guide;
    } else {
      ADD_FAILURE() << where
                    << ": a block without <!-- from: PATH -->, <!-- run by: PATH --> or "
                       "<!-- output of: PATH -->";
    }
  }
}

// The directory part of `path` ("" for a file at the root).
std::string Dir(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

// Every relative markdown link "[text](target)" of `doc` outside code blocks names a file in
// the test's data (resolved against the document's directory; a "#anchor" is left out).
void CheckLinks(const std::string& doc) {
  std::vector<std::string> lines;
  ASSERT_TRUE(ReadLines(doc, &lines)) << doc << ": not in the test's data";
  bool in_block = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (absl::StartsWith(Stripped(line), "```")) in_block = !in_block;
    if (in_block) continue;
    for (size_t at = line.find("]("); at != std::string::npos; at = line.find("](", at + 2)) {
      const size_t end = line.find(')', at + 2);
      if (end == std::string::npos) continue;
      std::string target = line.substr(at + 2, end - at - 2);
      if (absl::StrContains(target, "://") || absl::StartsWith(target, "mailto:")) continue;
      target = target.substr(0, target.find('#'));
      if (target.empty()) continue;
      const std::string path = std::filesystem::path(Dir(doc) + target).lexically_normal().string();
      EXPECT_TRUE(std::filesystem::exists(path))
          << doc << ":" << i + 1 << ": the link to " << target << " names " << path
          << ", which is not in //docs:guide_snippets_test's data (a missing file, or add it)";
    }
  }
}

TEST(GuideSnippetsTest, EveryBlockIsInTheCodeOrRunByATest) {
  for (const char* guide : kGuides) CheckGuide(guide);
}

TEST(GuideSnippetsTest, EveryRelativeLinkResolves) {
  for (const char* doc : kGuides) CheckLinks(doc);
  for (const char* doc : kLinkedDocs) CheckLinks(doc);
}

}  // namespace
