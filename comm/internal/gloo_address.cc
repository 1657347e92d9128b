#include "comm/internal/gloo_address.h"

#include <arpa/inet.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/address.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace comm {
namespace internal {
namespace {

using ::gloo::transport::tcp::Address;

std::string Display(const sockaddr_storage& ss) {
  char ip[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
    return absl::StrCat(ip, ":", ntohs(in->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
    return absl::StrCat("[", ip, "]:", ntohs(in6->sin6_port));
  }
  return absl::StrCat("(address family ", ss.ss_family, ")");
}

PeerAddress Describe(const Address& address) {
  return PeerAddress{address.str(), Display(address.getSockaddr())};
}

// One line of EncodeConnections: "<rank> <gloo form> <display form>" (neither form
// contains a space).
bool ParseConnectionLine(absl::string_view line, int* rank, PeerAddress* end) {
  std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (f.size() != 3 || !absl::SimpleAtoi(f[0], rank) || GlooAddressesIn(f[1]).size() != 1) {
    return false;
  }
  *end = PeerAddress{std::string(f[1]), std::string(f[2])};
  return true;
}

}  // namespace

size_t GlooAddressBytes() {
  static const size_t bytes = Address().bytes().size();
  return bytes;
}

absl::StatusOr<PeerAddress> ParseAddressList(absl::string_view value, int owner, int reader,
                                             int size) {
  if (size < 2 || owner < 0 || owner >= size || reader < 0 || reader >= size || owner == reader) {
    return absl::InvalidArgumentError(absl::StrCat("ParseAddressList: no address of rank ", owner,
                                                   " for rank ", reader, " in a group of ", size));
  }
  const size_t one = GlooAddressBytes();
  const size_t expected = one * static_cast<size_t>(size - 1);
  if (value.size() != expected) {
    return absl::DataLossError(absl::StrCat("holds ", value.size(), " bytes, but rank ", owner,
                                            "'s gloo addresses in a group of ", size, " take ",
                                            expected, " (", size - 1, " x ", one, ")"));
  }
  const bool has_seq = one == sizeof(sockaddr_storage) + sizeof(ssize_t);
  PeerAddress mine;
  for (int k = 0; k < size - 1; ++k) {
    const char* entry = value.data() + k * one;
    sockaddr_storage ss;
    std::memcpy(&ss, entry, sizeof(ss));
    const int peer = k < owner ? k : k + 1;  // the rank entry k is meant for
    const std::string which = absl::StrCat("its address for rank ", peer, " (entry ", k, ")");
    if (ss.ss_family != AF_INET) {
      return absl::DataLossError(
          absl::StrCat(which, " has address family ", ss.ss_family, ", not IPv4 (", AF_INET, ")"));
    }
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    if (in->sin_port == 0) return absl::DataLossError(absl::StrCat(which, " has port 0"));
    if (has_seq) {
      ssize_t seq = 0;
      std::memcpy(&seq, entry + sizeof(ss), sizeof(seq));
      if (seq != Address::kSequenceNumberUnset) {
        return absl::DataLossError(absl::StrCat(which, " has sequence number ", seq,
                                                ", not the -1 of a listening address"));
      }
    }
    if (peer == reader) mine = Describe(Address(ss));
  }
  return mine;
}

absl::Status CheckHostName(absl::string_view value) {
  if (value.empty() || value.size() > 255) {
    return absl::DataLossError(
        absl::StrCat("holds ", value.size(), " bytes, not a host name (1 to 255 characters)"));
  }
  for (size_t i = 0; i < value.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(value[i]);
    if (c <= 0x20 || c >= 0x7f) {
      return absl::DataLossError(
          absl::StrFormat("holds %d bytes that are not a host name (byte 0x%02x at offset %d)",
                          value.size(), c, i));
    }
  }
  return absl::OkStatus();
}

PeerAddress LocalEnd(const gloo::transport::Pair* pair) {
  if (pair == nullptr) return PeerAddress{};
  const auto* tcp = dynamic_cast<const Address*>(&pair->address());
  return tcp == nullptr ? PeerAddress{} : Describe(*tcp);
}

std::vector<std::string> GlooAddressesIn(absl::string_view message) {
  std::vector<std::string> found;
  size_t pos = 0;
  while ((pos = message.find('[', pos)) != absl::string_view::npos) {
    const size_t close = message.find(']', pos + 1);
    if (close == absl::string_view::npos) break;
    size_t end = close + 1;
    if (end < message.size() && message[end] == ':') {
      size_t digits = end + 1;
      while (digits < message.size() && absl::ascii_isdigit(message[digits])) ++digits;
      if (digits > end + 1) {
        found.emplace_back(message.substr(pos, digits - pos));
        pos = digits;
        continue;
      }
    }
    pos = close + 1;
  }
  return found;
}

void PeerDirectory::Add(const PeerAddress& address, int rank) {
  if (address.gloo_form.empty()) return;
  known_.emplace(address.gloo_form, std::make_pair(rank, address.display));
}

int PeerDirectory::RankIn(absl::string_view message, std::string* display) const {
  for (const std::string& address : GlooAddressesIn(message)) {
    auto it = known_.find(address);
    if (it == known_.end()) continue;
    if (display != nullptr) *display = it->second.second;
    return it->second.first;
  }
  return -1;
}

std::string EncodeConnections(const std::map<int, PeerAddress>& local_ends) {
  std::string out;
  for (const auto& [rank, end] : local_ends) {
    absl::StrAppend(&out, rank, " ", end.gloo_form, " ", end.display, "\n");
  }
  return out;
}

absl::StatusOr<PeerAddress> FindConnection(absl::string_view published, int owner, int reader) {
  for (absl::string_view line : absl::StrSplit(published, '\n', absl::SkipEmpty())) {
    int rank = -1;
    PeerAddress end;
    if (!ParseConnectionLine(line, &rank, &end)) {
      return absl::DataLossError(
          absl::StrCat("rank ", owner, "'s connection record has a malformed line"));
    }
    if (rank == reader) return end;
  }
  return absl::DataLossError(
      absl::StrCat("rank ", owner, "'s connection record has no entry for rank ", reader));
}

}  // namespace internal
}  // namespace comm
