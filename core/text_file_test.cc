#include "core/text_file.h"

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace core {
namespace {

using ::testing::HasSubstr;

std::string WriteFile(const std::string& name, const std::string& contents) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream out(path, std::ios::binary);
  out << contents;
  return path;
}

TEST(ReadTextFileTest, ReadsTextIncludingUtf8) {
  const std::string text = "fit_steps: 3\n# caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\n";
  absl::StatusOr<std::string> read = ReadTextFile(WriteFile("good.txt", text), "stage config");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, text);
  EXPECT_EQ(ReadTextFile(WriteFile("empty.txt", ""), "stage config").value(), "");
}

TEST(ReadTextFileTest, MissingFileIsNotFoundNamingIt) {
  const std::string path = ::testing::TempDir() + "/no_such_file.txt";
  absl::StatusOr<std::string> read = ReadTextFile(path, "stage config");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(read.status().message(), HasSubstr("stage config file '" + path + "'"));
}

TEST(ReadTextFileTest, DirectoryIsInvalidArgumentNamingIt) {
  const std::string dir = ::testing::TempDir();
  absl::StatusOr<std::string> read = ReadTextFile(dir, "policy config");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr("policy config file '" + dir + "'"));
  EXPECT_THAT(read.status().message(), HasSubstr("is a directory"));
}

TEST(ReadTextFileTest, BinaryFilesAreInvalidArgumentWithTheOffset) {
  const std::string nul = WriteFile("nul.bin", std::string("abc\0def", 7));
  absl::StatusOr<std::string> read = ReadTextFile(nul, "stage config");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr(nul));
  EXPECT_THAT(read.status().message(), HasSubstr("not a text file (byte 0x00 at offset 3"));

  const std::string latin1 = WriteFile("latin1.bin", "ok\nfit\xe9 \n");
  read = ReadTextFile(latin1, "stage config");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr("byte 0xe9 at offset 6 is not valid UTF-8"));
}

TEST(ReadTextFileTest, OversizedFileIsInvalidArgument) {
  const std::string path = WriteFile("big.txt", std::string(100, 'a'));
  EXPECT_TRUE(ReadTextFile(path, "x", /*max_bytes=*/100).ok());
  absl::StatusOr<std::string> read = ReadTextFile(path, "x", /*max_bytes=*/99);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr("larger than 99 bytes"));
}

TEST(ReadTextFileTest, UnreadablePathsAreInvalidArgument) {
  // A path through a regular file (ENOTDIR): it exists in no sense, but it is not
  // "missing" either; and a FIFO, which is not a regular file (reading it could block).
  const std::string file = WriteFile("plain.txt", "x");
  absl::StatusOr<std::string> read = ReadTextFile(file + "/inner", "stage config");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr(file + "/inner"));

  const std::string fifo = ::testing::TempDir() + "/config.fifo";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  read = ReadTextFile(fifo, "stage config");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr("is not a regular file"));
  ::unlink(fifo.c_str());
}

TEST(FirstNonTextByteTest, FindsTheFirstBadByte) {
  EXPECT_EQ(FirstNonTextByte(""), -1);
  EXPECT_EQ(FirstNonTextByte("plain ascii\n\t"), -1);
  EXPECT_EQ(FirstNonTextByte("\xc3\xa9"), -1);         // U+00E9
  EXPECT_EQ(FirstNonTextByte("a\xc3"), 1);             // truncated sequence
  EXPECT_EQ(FirstNonTextByte("ab\xc0\xaf"), 2);        // overlong '/'
  EXPECT_EQ(FirstNonTextByte("\xe0\x80\xaf"), 0);      // overlong 3-byte
  EXPECT_EQ(FirstNonTextByte("x\xed\xa0\x80"), 1);     // surrogate U+D800
  EXPECT_EQ(FirstNonTextByte("\xf4\x90\x80\x80"), 0);  // above U+10FFFF
  EXPECT_EQ(FirstNonTextByte("ok\x80"), 2);            // stray continuation
  EXPECT_EQ(FirstNonTextByte(absl::string_view("a\0b", 3)), 1);
}

TEST(WriteFileAtomicallyTest, WritesAnyBytesAndLeavesNoTemporaryFile) {
  std::string dir = ::testing::TempDir() + "/atomic.XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::string path = dir + "/summary.json";
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  const std::string binary("second\0version", 14);
  ASSERT_TRUE(WriteFileAtomically(path, binary).ok());
  std::ifstream in(path, std::ios::binary);
  const std::string read((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(read, binary);
  // Only the file itself is left: the temporary went by rename.
  ASSERT_EQ(::unlink(path.c_str()), 0);
  EXPECT_EQ(::rmdir(dir.c_str()), 0) << "the directory still holds a temporary file";
}

TEST(WriteFileAtomicallyTest, ErrorsNameThePath) {
  const std::string path = ::testing::TempDir() + "/no/such/dir/summary.json";
  absl::Status s = WriteFileAtomically(path, "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_EQ(WriteFileAtomically("", "x").code(), absl::StatusCode::kInvalidArgument);
}

// Names left in `dir` (without "." and "..").
std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string Contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(WriteFileAtomicallyTest, PiecesAreWrittenInOrderAsOneFile) {
  std::string dir = ::testing::TempDir() + "/pieces.XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::string path = dir + "/model.bin";
  const std::string big(1 << 20, 'x');
  const std::vector<absl::string_view> pieces = {"head", "", big, absl::string_view("\0t", 2)};
  ASSERT_TRUE(WriteFileAtomically(path, pieces).ok());
  EXPECT_EQ(Contents(path), absl::StrCat("head", big, absl::string_view("\0t", 2)));
  EXPECT_EQ(Entries(dir), std::vector<std::string>{"model.bin"});
}

TEST(WriteFileAtomicallyTest, AFailedWriteLeavesTheOldFileAndNoTemporaryFile) {
  std::string dir = ::testing::TempDir() + "/failed.XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::string path = dir + "/summary.json";
  ASSERT_TRUE(WriteFileAtomically(path, "old contents").ok());
  // A write that cannot complete: the file size limit is below the new contents, so
  // write(2) fails with EFBIG (SIGXFSZ ignored) after the temporary file exists.
  struct sigaction ignore = {}, before = {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &before), 0);
  rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  rlimit small = old_limit;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const absl::Status s = WriteFileAtomically(path, std::string(10000, 'n'));
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  ASSERT_EQ(::sigaction(SIGXFSZ, &before, nullptr), 0);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("WriteFileAtomically(" + path + "): cannot write"));
  EXPECT_THAT(s.message(), HasSubstr(dir + "/.summary.json.tmp."));
  EXPECT_EQ(Contents(path), "old contents");
  EXPECT_EQ(Entries(dir), std::vector<std::string>{"summary.json"});
}

TEST(WriteFileAtomicallyTest, AFailedRenameLeavesTheOldFileAndNoTemporaryFile) {
  std::string dir = ::testing::TempDir() + "/rename.XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  // `path` is a non-empty directory: the temporary file is written, the rename fails.
  const std::string path = dir + "/taken";
  ASSERT_EQ(::mkdir(path.c_str(), 0755), 0);
  ASSERT_TRUE(WriteFileAtomically(path + "/inside", "kept").ok());
  const absl::Status s = WriteFileAtomically(path, "new");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("cannot rename temporary file onto " + path));
  EXPECT_EQ(Contents(path + "/inside"), "kept");
  EXPECT_EQ(Entries(dir), std::vector<std::string>{"taken"});
}

TEST(SyncDirectoryTest, SyncsADirectoryAndNamesAMissingOne) {
  EXPECT_TRUE(SyncDirectory(::testing::TempDir()).ok());
  const std::string missing = ::testing::TempDir() + "/no_such_dir";
  const absl::Status s = SyncDirectory(missing);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("cannot open directory '" + missing + "'"));
}

}  // namespace
}  // namespace core
