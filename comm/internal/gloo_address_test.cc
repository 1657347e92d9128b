// Tests of the gloo address checks: what rendezvous accepts before gloo parses a value,
// how a rank is found from a gloo error message, and the connection records.
#include "comm/internal/gloo_address.h"

#include <arpa/inet.h>
#include <gloo/transport/tcp/address.h>
#include <netinet/in.h>

#include <cstring>
#include <string>

#include "gtest/gtest.h"

namespace comm {
namespace internal {
namespace {

// The bytes gloo's Address::bytes() gives for ip:port (a listening address).
std::string GlooBytes(const char* ip, uint16_t port) {
  sockaddr_storage ss;
  std::memset(&ss, 0, sizeof(ss));
  auto* in = reinterpret_cast<sockaddr_in*>(&ss);
  in->sin_family = AF_INET;
  in->sin_port = htons(port);
  inet_pton(AF_INET, ip, &in->sin_addr);
  std::vector<char> b = gloo::transport::tcp::Address(ss).bytes();
  return std::string(b.begin(), b.end());
}

std::string GlooForm(const char* ip, uint16_t port) {
  sockaddr_storage ss;
  std::memset(&ss, 0, sizeof(ss));
  auto* in = reinterpret_cast<sockaddr_in*>(&ss);
  in->sin_family = AF_INET;
  in->sin_port = htons(port);
  inet_pton(AF_INET, ip, &in->sin_addr);
  return gloo::transport::tcp::Address(ss).str();
}

TEST(GlooAddressTest, AddressSizeIsGloosSerialisedSize) {
  EXPECT_EQ(GlooAddressBytes(), GlooBytes("127.0.0.1", 1).size());
  EXPECT_GE(GlooAddressBytes(), sizeof(sockaddr_in));
}

TEST(GlooAddressTest, ParseAddressListReturnsTheEntryMeantForTheReader) {
  // Rank 1 of 4 lists its addresses for ranks 0, 2, 3 in that order.
  const std::string value =
      GlooBytes("127.0.0.1", 1000) + GlooBytes("127.0.0.1", 2002) + GlooBytes("10.1.2.3", 3003);
  for (const auto& [reader, port, ip] : std::vector<std::tuple<int, int, std::string>>{
           {0, 1000, "127.0.0.1"}, {2, 2002, "127.0.0.1"}, {3, 3003, "10.1.2.3"}}) {
    absl::StatusOr<PeerAddress> a = ParseAddressList(value, 1, reader, 4);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->display, absl::StrCat(ip, ":", port)) << "reader " << reader;
    EXPECT_EQ(a->gloo_form, GlooForm(ip.c_str(), port)) << "reader " << reader;
  }
}

TEST(GlooAddressTest, ParseAddressListRejectsWrongLengths) {
  const std::string one = GlooBytes("127.0.0.1", 1000);
  for (const std::string& value :
       {std::string(), std::string(200, 'x'), one.substr(0, 100), one + one, one + "x"}) {
    absl::StatusOr<PeerAddress> a = ParseAddressList(value, 1, 0, 2);
    EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss) << value.size();
    EXPECT_NE(a.status().message().find(absl::StrCat("holds ", value.size(), " bytes")),
              std::string::npos)
        << a.status();
    EXPECT_NE(a.status().message().find("rank 1"), std::string::npos) << a.status();
  }
}

TEST(GlooAddressTest, ParseAddressListRejectsWhatGlooCouldNotHaveWritten) {
  const std::string good = GlooBytes("127.0.0.1", 1000);
  std::string family = good;
  family[0] = family[1] = static_cast<char>(0xab);  // ss_family
  std::string port0 = GlooBytes("127.0.0.1", 0);
  std::string seq = good;
  seq[seq.size() - 1] = 0x05;  // sequence number no longer -1
  const std::string garbage(GlooAddressBytes(), static_cast<char>(0xab));
  struct Case {
    std::string value;
    std::string says;
  };
  for (const Case& c : {Case{family, "address family"}, Case{port0, "port 0"},
                        Case{seq, "sequence number"}, Case{garbage, "address family"}}) {
    absl::StatusOr<PeerAddress> a = ParseAddressList(good + c.value, 2, 0, 3);
    EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss) << c.says;
    EXPECT_NE(a.status().message().find(c.says), std::string::npos) << a.status();
    // Entry 1 of rank 2's list is its address for rank 1.
    EXPECT_NE(a.status().message().find("for rank 1 (entry 1)"), std::string::npos) << a.status();
  }
}

TEST(GlooAddressTest, ParseAddressListRejectsImpossibleRanks) {
  const std::string v = GlooBytes("127.0.0.1", 1000);
  EXPECT_EQ(ParseAddressList(v, 0, 0, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseAddressList(v, 2, 0, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseAddressList(v, 0, 1, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GlooAddressTest, CheckHostNameAcceptsHostNamesOnly) {
  EXPECT_TRUE(CheckHostName("node-17.cluster.example").ok());
  EXPECT_TRUE(CheckHostName(std::string(255, 'a')).ok());
  EXPECT_EQ(CheckHostName("").code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(CheckHostName(std::string(256, 'a')).code(), absl::StatusCode::kDataLoss);
  absl::Status s =
      CheckHostName(std::string("abc\x01"
                                "def",
                                7));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("0x01 at offset 3"), std::string::npos) << s;
  EXPECT_EQ(CheckHostName("has space").code(), absl::StatusCode::kDataLoss);
}

TEST(GlooAddressTest, GlooAddressesInFindsBracketedAddressesWithPorts) {
  EXPECT_EQ(GlooAddressesIn("[/x/pair.cc:598] Connection closed by peer [127.0.0.1]:12345"),
            std::vector<std::string>{"[127.0.0.1]:12345"});
  EXPECT_EQ(GlooAddressesIn("Pair is not connected ([10.0.0.1]:1 <--> [::1]:22$3)"),
            (std::vector<std::string>{"[10.0.0.1]:1", "[::1]:22"}));
  EXPECT_TRUE(GlooAddressesIn("Timed out waiting 400ms for recv operation").empty());
  EXPECT_TRUE(GlooAddressesIn("[none] and [127.0.0.1]: and [unclosed").empty());
}

TEST(GlooAddressTest, PeerDirectoryNamesTheRankOfTheFirstKnownAddress) {
  PeerDirectory d;
  d.Add(PeerAddress{GlooForm("127.0.0.1", 4000), "127.0.0.1:4000"}, 2);
  d.Add(PeerAddress{GlooForm("127.0.0.1", 5000), "127.0.0.1:5000"}, 3);
  std::string shown;
  EXPECT_EQ(
      d.RankIn(absl::StrCat("Connection closed by peer ", GlooForm("127.0.0.1", 5000)), &shown), 3);
  EXPECT_EQ(shown, "127.0.0.1:5000");
  EXPECT_EQ(d.RankIn(absl::StrCat("a ", GlooForm("127.0.0.1", 6000), " then ",
                                  GlooForm("127.0.0.1", 4000))),
            2);
  EXPECT_EQ(d.RankIn(absl::StrCat("peer ", GlooForm("127.0.0.1", 6000))), -1);
  EXPECT_EQ(d.RankIn("no address"), -1);
}

TEST(GlooAddressTest, ConnectionRecordsRoundTripAndRejectMalformedOnes) {
  std::map<int, PeerAddress> ends = {{0, {GlooForm("127.0.0.1", 4000), "127.0.0.1:4000"}},
                                     {2, {GlooForm("127.0.0.1", 4001), "127.0.0.1:4001"}}};
  const std::string record = EncodeConnections(ends);
  absl::StatusOr<PeerAddress> to2 = FindConnection(record, 1, 2);
  ASSERT_TRUE(to2.ok()) << to2.status();
  EXPECT_EQ(to2->gloo_form, ends[2].gloo_form);
  EXPECT_EQ(to2->display, "127.0.0.1:4001");
  EXPECT_EQ(FindConnection(record, 1, 3).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(FindConnection("garbage\n", 1, 0).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(FindConnection(std::string(200, '\xff'), 1, 0).status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace internal
}  // namespace comm
