// The lost-ranks file of comm::Launch (NOTE [Restarts] in comm/launcher.h): a text file
// where a line holding a rank number marks that rank's slot lost for good. A rank appends
// its own number, an operator or a test hook any number; the launcher reads the file when
// a restart is due and starts the job again without those slots.
//
//   LostRanksFile file;
//   RETURN_IF_ERROR(file.Open(""));          // a fresh file in a temporary directory
//   ...                                      // ranks append "2\n" to file.path()
//   ASSIGN_OR_RETURN(LostRanks lost, file.Read(/*nproc=*/4));  // lost.ranks == {2}
//   RETURN_IF_ERROR(file.Truncate());        // a later restart counts new losses only
#ifndef COMM_INTERNAL_LOST_RANKS_H_
#define COMM_INTERNAL_LOST_RANKS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace comm {
namespace internal {

// What a lost-ranks file says about a job of some number of ranks.
struct LostRanks {
  // The distinct rank numbers in [0, nproc), ascending.
  std::vector<int> ranks;
  // The other non-blank lines (not a number, or a number outside [0, nproc)), as written
  // but without surrounding whitespace, in file order.
  std::vector<std::string> ignored;
};

// Parses the text of a lost-ranks file for a job of `nproc` ranks. Blank lines are
// skipped; a line is one decimal rank number with optional surrounding whitespace.
LostRanks ParseLostRanks(absl::string_view text, int nproc);

// The file the launcher hands its ranks in FSDP_LOST_RANKS_FILE.
class LostRanksFile {
 public:
  LostRanksFile() = default;
  LostRanksFile(const LostRanksFile&) = delete;
  LostRanksFile& operator=(const LostRanksFile&) = delete;
  // Removes the file and the temporary directory when Open created them; a path the
  // caller gave is left in place.
  ~LostRanksFile();

  // Creates `path` empty (truncating what it held), or, when `path` is empty, a file in
  // a fresh directory under $TMPDIR (else /tmp). An error naming the path when either
  // cannot be created. Call once.
  absl::Status Open(const std::string& path);
  // The file's path ("" before Open).
  const std::string& path() const { return path_; }
  // The lost ranks of a job of `nproc` ranks (ParseLostRanks). An error naming the path
  // when the file cannot be read (a missing file included).
  absl::StatusOr<LostRanks> Read(int nproc) const;
  // Empties the file (creating it again if it was removed).
  absl::Status Truncate() const;

 private:
  std::string path_;
  std::string temporary_dir_;  // "" when the caller gave the path
};

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_LOST_RANKS_H_
