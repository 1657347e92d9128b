#include "comm/agreement.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "comm/failure.h"
#include "core/status_macros.h"
#include "core/tensor.h"

namespace comm {
namespace {

// One rank's status on the wire: "" for OK, else "<code>\n<culprits or ->\n<message>".
std::string Encode(const absl::Status& s) {
  if (s.ok()) return "";
  std::string culprits = IsSecondary(s) ? absl::StrJoin(CulpritRanks(s), ",") : "-";
  if (culprits.empty()) culprits = ",";  // secondary, culprit unknown
  return absl::StrCat(static_cast<int>(s.code()), "\n", culprits, "\n", s.message());
}

struct Decoded {
  bool failed = false;
  bool secondary = false;
  std::vector<int> culprits;
  absl::Status status;
};

Decoded Decode(const std::string& bytes, int rank) {
  Decoded d;
  if (bytes.empty()) return d;
  d.failed = true;
  std::vector<std::string> parts = absl::StrSplit(bytes, absl::MaxSplits('\n', 2));
  int code = static_cast<int>(absl::StatusCode::kUnknown);
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &code) || code <= 0 || code > 16) {
    d.status = absl::InternalError(absl::StrCat("rank ", rank, " sent an undecodable status"));
    return d;
  }
  if (parts[1] != "-") {
    d.secondary = true;
    for (absl::string_view c : absl::StrSplit(parts[1], ',', absl::SkipEmpty())) {
      int r = 0;
      if (absl::SimpleAtoi(c, &r)) d.culprits.push_back(r);
    }
  }
  d.status = absl::Status(static_cast<absl::StatusCode>(code), parts[2]);
  return d;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> AllGatherBytes(ProcessGroup* group,
                                                        const std::string& bytes,
                                                        absl::Duration timeout) {
  if (group == nullptr || group->size() == 1) return std::vector<std::string>{bytes};
  if (bytes.size() > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("comm::AllGatherBytes: this rank's message is ",
                                                   bytes.size(), " bytes, more than 2^31 - 1"));
  }
  const int n = group->size();
  AllGatherOptions options;
  options.timeout = timeout;
  core::Tensor length = core::Tensor::Empty({1}, core::DType::kInt32, core::MemoryTag::kComm);
  length.data<int32_t>()[0] = static_cast<int32_t>(bytes.size());
  core::Tensor lengths = core::Tensor::Empty({n}, core::DType::kInt32, core::MemoryTag::kComm);
  ASSIGN_OR_RETURN(auto work, group->AllGather(length, lengths, options));
  RETURN_IF_ERROR(work->Wait(timeout));
  int64_t longest = 0;
  for (int r = 0; r < n; ++r) {
    const int32_t len = lengths.data<int32_t>()[r];
    if (len < 0) {
      return absl::InternalError(
          absl::StrCat("comm::AllGatherBytes: rank ", r, " sent length ", len));
    }
    longest = std::max<int64_t>(longest, len);
  }
  const int64_t words = std::max<int64_t>(1, (longest + 3) / 4);
  core::Tensor mine = core::Tensor::Zeros({words}, core::DType::kInt32, core::MemoryTag::kComm);
  if (!bytes.empty()) std::memcpy(mine.raw_data(), bytes.data(), bytes.size());
  core::Tensor all = core::Tensor::Empty({n * words}, core::DType::kInt32, core::MemoryTag::kComm);
  ASSIGN_OR_RETURN(work, group->AllGather(mine, all, options));
  RETURN_IF_ERROR(work->Wait(timeout));
  std::vector<std::string> out(n);
  const char* base = static_cast<const char*>(all.raw_data());
  for (int r = 0; r < n; ++r) {
    out[r].assign(base + r * words * 4, static_cast<size_t>(lengths.data<int32_t>()[r]));
  }
  return out;
}

absl::Status AgreeOnStatus(ProcessGroup* group, const absl::Status& local, absl::string_view what,
                           absl::Duration timeout) {
  const int rank = group == nullptr ? 0 : group->rank();
  const int world = group == nullptr ? 1 : group->size();
  if (!local.ok() && !IsSecondary(local)) RecordFailure(local, rank).IgnoreError();
  if (world == 1) return local;
  absl::StatusOr<std::vector<std::string>> all = AllGatherBytes(group, Encode(local), timeout);
  if (!all.ok()) {
    if (local.ok()) {
      return core::Annotate(all.status(),
                            absl::StrCat(what, ": agreeing on the outcome across ranks"));
    }
    // Our own error is the news; the failed exchange is a consequence of it or of a peer.
    return local;
  }
  // The lowest rank with a root-cause error; failing that, the lowest failing rank.
  int chosen = -1;
  std::vector<Decoded> decoded;
  for (int r = 0; r < world; ++r) decoded.push_back(Decode((*all)[r], r));
  for (int r = 0; r < world && chosen < 0; ++r) {
    if (decoded[r].failed && !decoded[r].secondary) chosen = r;
  }
  for (int r = 0; r < world && chosen < 0; ++r) {
    if (decoded[r].failed) chosen = r;
  }
  if (chosen < 0) return absl::OkStatus();
  const Decoded& d = decoded[chosen];
  absl::Status out = core::Annotate(d.status, absl::StrCat("rank ", chosen));
  if (d.secondary) return MarkSecondary(out, d.culprits);
  if (chosen != rank) return MarkSecondary(out, {chosen});
  return out;
}

}  // namespace comm
