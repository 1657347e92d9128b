// FileStore: a Store kept in a directory that every participating process can see (a
// local path for one machine, a shared filesystem for several). Each key is one file;
// Set writes a temporary file and renames it into place, so readers never see a
// partial value; Add serialises through flock(2) on a lock file in the directory.
//
//   auto store = comm::FileStore::Open("/tmp/job42_store").value();
//   RETURN_IF_ERROR(store->Set("0", address));
//   ASSIGN_OR_RETURN(std::string peer, store->Get("1", absl::Seconds(60)));
//
// Waiting polls the directory with backoff (1 ms growing to 50 ms), so latency is
// tens of milliseconds at worst: fine for rendezvous, not a message queue. The
// directory is left in place; remove it when the job is over. Calls made for
// rendezvous must follow NOTE [Same order on all ranks] in comm/store.h.
#ifndef COMM_FILE_STORE_H_
#define COMM_FILE_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "comm/store.h"

namespace comm {

class FileStore : public Store {
 public:
  // Uses directory `path`, creating it (and missing parents) if needed.
  // InvalidArgument for an empty path; Internal when it cannot be created.
  static absl::StatusOr<std::shared_ptr<FileStore>> Open(const std::string& path);

  const std::string& path() const { return path_; }

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override;
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override;
  // "the store in <path>".
  std::string Describe() const override { return absl::StrCat("the store in ", path_); }

 private:
  explicit FileStore(std::string path) : path_(std::move(path)) {}

  // The file that holds `key` (the key percent-encoded, so any byte string works).
  std::string KeyPath(absl::string_view key) const;
  absl::Status WriteAtomically(const std::string& file, absl::string_view value);
  // NotFound when the key is absent.
  absl::StatusOr<std::string> ReadKey(absl::string_view key) const;

  std::string path_;
};

}  // namespace comm

#endif  // COMM_FILE_STORE_H_
