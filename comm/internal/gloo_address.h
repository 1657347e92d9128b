// Gloo's TCP addresses as they travel through the store and appear in gloo's errors:
// checking what rendezvous reads before gloo parses it, naming a peer by rank from an
// error message, and confirming that every connection reached the rank it was meant for.
//
//   // In the store adapter, before gloo sees the value of key "1" (rank 1's addresses):
//   ASSIGN_OR_RETURN(internal::PeerAddress a,
//                    internal::ParseAddressList(value, /*owner=*/1, /*reader=*/0, size));
//   // After a collective failed with "Connection closed by peer [127.0.0.1]:2911":
//   int culprit = directory.RankIn(error_message);   // 1, or -1 when unknown
//
// Debian's libgloo-dev lacks a header that gloo/transport/tcp/pair.h needs, so only
// the generic transport::Pair interface (which gives the local end) is used here.
//
// NOTE [Gloo TCP addresses]: gloo (Debian's 2022 libgloo) serialises an address as the
// raw bytes of { sockaddr_storage ss; ssize_t seq; } (GlooAddressBytes(), 136 bytes on
// x86-64). Its rendezvous stores under key "<r>" the concatenation of rank r's listening
// addresses for its size - 1 pairs (peers in rank order, r itself skipped) and under
// "rank_<r>" its host name. Gloo checks only the total length; an address of the wrong
// family or port makes it throw, and a right-looking one that points elsewhere makes it
// connect to whatever listens there. In its messages gloo prints an address as
// "[ip]:port" where `port` is sin_port *without* byte-order conversion (its "gloo form");
// we show "ip:port" with the real port (the "display form").
#ifndef COMM_INTERNAL_GLOO_ADDRESS_H_
#define COMM_INTERNAL_GLOO_ADDRESS_H_

#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gloo {
namespace transport {
class Pair;
}  // namespace transport
}  // namespace gloo

namespace comm {
namespace internal {

// Size of one serialised gloo TCP address (NOTE [Gloo TCP addresses]).
size_t GlooAddressBytes();

// One peer address in both forms.
struct PeerAddress {
  std::string gloo_form;  // "[127.0.0.1]:53920", as gloo prints it
  std::string display;    // "127.0.0.1:41170"
};

// Checks `value`, the store value that rank `owner` of a group of `size` wrote with its
// listening addresses, and returns the one meant for rank `reader`. DataLoss saying what
// is wrong (length, address family, port) when the bytes cannot be gloo's; the message
// does not name the key, which the caller adds.
absl::StatusOr<PeerAddress> ParseAddressList(absl::string_view value, int owner, int reader,
                                             int size);

// Checks `value`, the host name rank `owner` stored under "rank_<owner>": 1 to 255
// printable, non-space ASCII characters. DataLoss describing the first bad byte otherwise.
absl::Status CheckHostName(absl::string_view value);

// The address of the local end of a connected gloo TCP pair (its getsockname): what
// the peer's gloo shows as this rank's address in its messages. Empty forms if `pair`
// is not a TCP pair.
PeerAddress LocalEnd(const gloo::transport::Pair* pair);

// The "[ip]:port" addresses in a gloo message, in order (gloo form).
std::vector<std::string> GlooAddressesIn(absl::string_view message);

// Which rank each known peer address belongs to. Filled at rendezvous, read when a
// collective fails; not synchronised (fill it before sharing it).
class PeerDirectory {
 public:
  void Add(const PeerAddress& address, int rank);
  // The rank of the first address in `message` that belongs to a known peer, and that
  // address in display form (when `display` is not null); -1 if none.
  int RankIn(absl::string_view message, std::string* display = nullptr) const;

 private:
  std::map<std::string, std::pair<int, std::string>> known_;  // gloo form -> rank, display
};

// What one rank publishes after connecting (NOTE [Connection check] in
// comm/gloo_process_group.cc): for each peer j, the local end of its pair j.
std::string EncodeConnections(const std::map<int, PeerAddress>& local_ends);

// From `published`, an EncodeConnections value of rank `owner`, the local end of its
// pair with rank `reader`. DataLoss when `published` is malformed or has no such entry.
absl::StatusOr<PeerAddress> FindConnection(absl::string_view published, int owner, int reader);

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_GLOO_ADDRESS_H_
