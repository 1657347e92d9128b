// Store::Describe(): how each store names itself in messages.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/file_store.h"
#include "comm/hash_store.h"
#include "comm/prefix_store.h"
#include "comm/store.h"
#include "comm/tcp_store.h"
#include "gtest/gtest.h"

namespace comm {
namespace {

// A store that overrides nothing but the pure virtuals.
class PlainStore : public Store {
 public:
  absl::Status Set(absl::string_view, absl::string_view) override { return absl::OkStatus(); }
  absl::StatusOr<std::string> Get(absl::string_view, absl::Duration) override { return ""; }
  absl::StatusOr<int64_t> Add(absl::string_view, int64_t delta) override { return delta; }
  absl::Status Wait(const std::vector<std::string>&, absl::Duration) override {
    return absl::OkStatus();
  }
  absl::StatusOr<bool> Check(const std::vector<std::string>&) override { return true; }
};

TEST(StoreDescribeTest, DefaultIsTheStore) { EXPECT_EQ(PlainStore().Describe(), "the store"); }

TEST(StoreDescribeTest, HashStoreIsInProcess) {
  EXPECT_EQ(HashStore().Describe(), "the in-process store");
}

TEST(StoreDescribeTest, FileStoreNamesItsDirectory) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/describe_store");
  absl::StatusOr<std::shared_ptr<FileStore>> store = FileStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Describe(), absl::StrCat("the store in ", dir));
}

TEST(StoreDescribeTest, TcpStoreNamesItsAddressOnServerAndClient) {
  TcpStoreOptions server_options;
  server_options.is_server = true;
  absl::StatusOr<std::shared_ptr<TcpStore>> server = TcpStore::Create(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  EXPECT_EQ((*server)->Describe(), absl::StrCat("the store at ", address));
  TcpStoreOptions client_options;
  client_options.port = (*server)->port();
  absl::StatusOr<std::shared_ptr<TcpStore>> client = TcpStore::Create(client_options);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->Describe(), absl::StrCat("the store at ", address));
}

TEST(StoreDescribeTest, PrefixStoresNameTheStoreTheyView) {
  auto base = std::make_shared<HashStore>();
  auto world = std::make_shared<PrefixStore>(base, "world");
  PrefixStore sub(world, "sub0");
  EXPECT_EQ(world->Describe(), base->Describe());
  EXPECT_EQ(sub.Describe(), base->Describe());
  PrefixStore over_plain(std::make_shared<PlainStore>(), "world");
  EXPECT_EQ(over_plain.Describe(), "the store");
}

}  // namespace
}  // namespace comm
