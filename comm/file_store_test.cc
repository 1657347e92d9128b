#include "comm/file_store.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "comm/testing/store_conformance.h"
#include "gtest/gtest.h"

namespace comm {
namespace {

using ::comm::testing::StoreConformanceTest;

std::string FreshDir(const std::string& tag) {
  static int counter = 0;
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/file_store_", tag, "_", ::getpid(), "_",
                      counter++);
}

INSTANTIATE_TEST_SUITE_P(
    FileStore, StoreConformanceTest,
    ::testing::Values(testing::StoreFactory{
        "FileStore",
        []() -> std::shared_ptr<Store> { return FileStore::Open(FreshDir("conf")).value(); },
        // A second object on the same directory, as another process would open it.
        [](const std::shared_ptr<Store>& s) -> std::shared_ptr<Store> {
          return FileStore::Open(std::static_pointer_cast<FileStore>(s)->path()).value();
        }}),
    testing::StoreFactoryName);

TEST(FileStoreTest, OpenCreatesNestedDirectories) {
  const std::string dir = FreshDir("nested") + "/a/b";
  auto store = FileStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Set("k", "v").ok());
  EXPECT_EQ(FileStore::Open(dir).value()->Get("k", absl::Seconds(1)).value(), "v");
}

TEST(FileStoreTest, EmptyPathIsInvalidArgument) {
  EXPECT_EQ(FileStore::Open("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FileStoreTest, LongKeysWork) {
  auto store = FileStore::Open(FreshDir("long")).value();
  const std::string a(500, 'a');
  const std::string b = a + "b";
  ASSERT_TRUE(store->Set(a, "1").ok());
  ASSERT_TRUE(store->Set(b, "2").ok());
  EXPECT_EQ(store->Get(a, absl::Seconds(1)).value(), "1");
  EXPECT_EQ(store->Get(b, absl::Seconds(1)).value(), "2");
}

TEST(FileStoreTest, AddIsAtomicAcrossProcesses) {
  const std::string dir = FreshDir("procs");
  ASSERT_TRUE(FileStore::Open(dir).ok());
  constexpr int kProcs = 3, kAdds = 40;
  std::vector<pid_t> children;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto store = FileStore::Open(dir);
      int bad = store.ok() ? 0 : 1;
      for (int i = 0; i < kAdds && bad == 0; ++i) bad = (*store)->Add("n", 1).ok() ? 0 : 1;
      ::_exit(bad);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_EQ(FileStore::Open(dir).value()->Add("n", 0).value(), kProcs * kAdds);
}

}  // namespace
}  // namespace comm
