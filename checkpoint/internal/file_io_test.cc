#include "checkpoint/internal/file_io.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace checkpoint {
namespace internal {
namespace {

// Names of the entries of `dir`.
std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename());
  return out;
}

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/file_io_", name);
  EXPECT_TRUE(RemoveRecursively(dir).ok());
  EXPECT_TRUE(MakeDirectories(dir).ok());
  return dir;
}

absl::Status WriteString(const std::string& path, const std::string& s) {
  absl::StatusOr<FileWriter> w = FileWriter::Create(path);
  if (!w.ok()) return w.status();
  absl::Status a = w->Append(s.data(), s.size());
  if (!a.ok()) return a;
  return w->SyncAndClose();
}

TEST(FileIoTest, WriteThenReadAtReportsShortReadsAtEnd) {
  const std::string dir = TestDir("rw");
  const std::string path = dir + "/f";
  ASSERT_TRUE(WriteString(path, "0123456789").ok());
  absl::StatusOr<FileReader> r = FileReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->Size().value(), 10);
  char buf[8];
  absl::StatusOr<size_t> got = r->ReadAt(3, 4, buf);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, 4u);
  EXPECT_EQ(std::string(buf, 4), "3456");
  got = r->ReadAt(7, 8, buf);  // only 3 bytes left
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, 3u);
  EXPECT_EQ(std::string(buf, 3), "789");
  EXPECT_EQ(ReadFileToString(path).value(), "0123456789");
}

TEST(FileIoTest, MissingFileIsNotFoundNamingThePath) {
  const std::string dir = TestDir("missing");
  absl::StatusOr<FileReader> r = FileReader::Open(dir + "/nope");
  EXPECT_TRUE(absl::IsNotFound(r.status())) << r.status();
  EXPECT_NE(r.status().message().find(dir + "/nope"), std::string::npos) << r.status();
}

TEST(FileIoTest, ParentDirectory) {
  EXPECT_EQ(ParentDirectory("a/b/c"), "a/b");
  EXPECT_EQ(ParentDirectory("a/b/c/"), "a/b");
  EXPECT_EQ(ParentDirectory("c"), ".");
  EXPECT_EQ(ParentDirectory("/c"), "/");
}

// Many threads asking for directories under one base at once all get distinct ones
// that exist (mkdir refuses a name already taken).
TEST(FileIoTest, ConcurrentUniqueDirectoriesNeverCollide) {
  const std::string dir = TestDir("unique");
  absl::Mutex mu;
  std::set<std::string> names;
  int failures = 0;
  std::vector<std::thread> threads;
  constexpr int kThreads = 8, kEach = 50;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        absl::StatusOr<std::string> p = MakeUniqueDirectory(dir + "/ckpt.tmp-");
        absl::MutexLock lock(&mu);
        if (!p.ok()) {
          ++failures;
        } else {
          names.insert(*p);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(names.size(), static_cast<size_t>(kThreads * kEach));
  for (const std::string& n : names) EXPECT_TRUE(PathExists(n)) << n;
}

TEST(FileIoTest, UniqueTokensDifferAndAreHex) {
  std::set<std::string> tokens;
  for (int i = 0; i < 1000; ++i) {
    const std::string t = UniqueToken();
    ASSERT_EQ(t.size(), 16u);
    ASSERT_EQ(t.find_first_not_of("0123456789abcdef"), std::string::npos) << t;
    tokens.insert(t);
  }
  EXPECT_EQ(tokens.size(), 1000u);
}

class CommitTest : public ::testing::TestWithParam<CommitMode> {};

TEST_P(CommitTest, ReplacesTargetAndDeletesTheOldOne) {
  const std::string dir = TestDir(absl::StrCat("commit_", static_cast<int>(GetParam())));
  const std::string target = dir + "/ckpt";
  ASSERT_TRUE(MakeDirectories(target).ok());
  ASSERT_TRUE(WriteString(target + "/v", "old").ok());
  const std::string staged = dir + "/ckpt.tmp-1";
  ASSERT_TRUE(MakeDirectories(staged).ok());
  ASSERT_TRUE(WriteString(staged + "/v", "new").ok());
  ASSERT_TRUE(CommitDirectory(staged, target, GetParam()).ok());
  EXPECT_EQ(ReadFileToString(target + "/v").value(), "new");
  EXPECT_FALSE(PathExists(staged));
  // Nothing else is left in `dir`: the old directory is gone.
  EXPECT_EQ(Entries(dir), std::vector<std::string>{"ckpt"});
}

TEST_P(CommitTest, MovesIntoPlaceWhenTargetIsMissing) {
  const std::string dir = TestDir(absl::StrCat("commit_new_", static_cast<int>(GetParam())));
  const std::string staged = dir + "/ckpt.tmp-1";
  ASSERT_TRUE(MakeDirectories(staged).ok());
  ASSERT_TRUE(WriteString(staged + "/v", "new").ok());
  ASSERT_TRUE(CommitDirectory(staged, dir + "/ckpt", GetParam()).ok());
  EXPECT_EQ(ReadFileToString(dir + "/ckpt/v").value(), "new");
}

TEST_P(CommitTest, FailingHookKeepsNewInPlaceAndOldUndeleted) {
  const std::string dir = TestDir(absl::StrCat("commit_hook_", static_cast<int>(GetParam())));
  const std::string target = dir + "/ckpt";
  ASSERT_TRUE(MakeDirectories(target).ok());
  ASSERT_TRUE(WriteString(target + "/v", "old").ok());
  const std::string staged = dir + "/ckpt.tmp-1";
  ASSERT_TRUE(MakeDirectories(staged).ok());
  ASSERT_TRUE(WriteString(staged + "/v", "new").ok());
  absl::Status s =
      CommitDirectory(staged, target, GetParam(), [] { return absl::AbortedError("crash"); });
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_EQ(ReadFileToString(target + "/v").value(), "new");
  // The old contents survive somewhere beside the target.
  std::vector<std::string> entries = Entries(dir);
  ASSERT_EQ(entries.size(), 2u);
  const std::string other = entries[0] == "ckpt" ? entries[1] : entries[0];
  EXPECT_EQ(ReadFileToString(dir + "/" + other + "/v").value(), "old") << other;
}

INSTANTIATE_TEST_SUITE_P(Modes, CommitTest,
                         ::testing::Values(CommitMode::kAtomicExchange, CommitMode::kRenameAside));

// FileLock: one holder at a time; the file is gone once released; a waiter gets it.
TEST(FileLockTest, ExcludesOtherHoldersAndRemovesTheFileOnRelease) {
  const std::string dir = TestDir("lock");
  const std::string path = dir + "/ckpt.lock";
  {
    absl::StatusOr<FileLock> held = FileLock::Acquire(path, absl::ZeroDuration());
    ASSERT_TRUE(held.ok()) << held.status();
    EXPECT_TRUE(PathExists(path));
    absl::StatusOr<FileLock> other = FileLock::Acquire(path, absl::Milliseconds(50));
    EXPECT_TRUE(absl::IsDeadlineExceeded(other.status())) << other.status();
    EXPECT_NE(std::string(other.status().message()).find(path), std::string::npos)
        << other.status();
  }
  EXPECT_FALSE(PathExists(path));
  absl::StatusOr<FileLock> again = FileLock::Acquire(path, absl::ZeroDuration());
  EXPECT_TRUE(again.ok()) << again.status();
}

// Many threads taking turns, each holding the lock briefly: never two at once, even
// though every release removes the file others are waiting on.
TEST(FileLockTest, ThreadsNeverHoldItTogether) {
  const std::string path = TestDir("lock_threads") + "/x.lock";
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::atomic<int> acquired{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        absl::StatusOr<FileLock> lock = FileLock::Acquire(path, absl::Seconds(20));
        if (!lock.ok()) continue;
        ++acquired;
        if (inside.fetch_add(1) != 0) ++overlaps;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        inside.fetch_sub(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(acquired.load(), 100);
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_FALSE(PathExists(path));
}

}  // namespace
}  // namespace internal
}  // namespace checkpoint
