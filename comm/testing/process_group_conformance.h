// A conformance suite every ProcessGroup backend must pass: the rules of
// comm/process_group.h checked on N thread ranks (comm/testing/thread_ranks.h) through
// the public API only. Each collective at sizes that change from call to call (zero
// included), fp32/bf16/int32, sum/average/max, in place and not; completion in issue
// order; bf16 reductions accumulated in fp32; the byte counters (NOTE [Byte counters]);
// argument checks; deadlines, broken groups and peers that leave; Wait's contract;
// subgroups. A backend's test instantiates it with a factory and the world sizes it runs:
//
//   INSTANTIATE_TEST_SUITE_P(Gloo, ProcessGroupConformanceTest,
//       ::testing::ValuesIn(comm::testing::ConformanceCases(
//           {"Gloo", [](std::shared_ptr<comm::Store> store, int rank, int size)
//                        -> absl::StatusOr<std::shared_ptr<comm::ProcessGroup>> {
//              return comm::GlooProcessGroup::Create(store, rank, size, {});
//            }},
//           {1, 2, 3, 4})),
//       comm::testing::ConformanceCaseName);
//
// Tests that need more ranks than a case has skip (saying so), and every test skips when
// the factory's `skip_reason` is not empty (a GPU backend on a machine without one).
// Expected values are exact: inputs are small integers (exact in fp32, in bf16 below
// 256), so sums are exact in any order and the only rounding is one division (average)
// or one conversion to bf16. Bitwise agreement of inexact sums is a backend's own test.
#ifndef COMM_TESTING_PROCESS_GROUP_CONFORMANCE_H_
#define COMM_TESTING_PROCESS_GROUP_CONFORMANCE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/process_group.h"
#include "comm/store.h"
#include "comm/testing/thread_ranks.h"
#include "comm/work.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace comm {
namespace testing {

// How to make one backend's groups.
struct ProcessGroupFactory {
  // Test-name part ("Gloo", "Shm_Slots"): letters, digits and '_' only.
  std::string name;
  // Rank `rank` of a new `size`-rank group named "world" over `store` (fresh for each
  // group: the suite never creates two "world" groups over one store). Called on each
  // rank's thread, with that rank's allocator current.
  std::function<absl::StatusOr<std::shared_ptr<ProcessGroup>>(std::shared_ptr<Store> store,
                                                              int rank, int size)>
      create;
  // Non-empty: every test skips with this reason (e.g. "no GPU here").
  std::function<std::string()> skip_reason;
  // Whether the backend refuses tensors on a device (InvalidArgument naming it): true
  // for the CPU backends, false for a GPU backend.
  bool host_only = true;
};

// One test case: a backend at one world size.
struct ConformanceCase {
  ProcessGroupFactory backend;
  int world_size = 1;
};

// `backend` at each of `world_sizes`.
std::vector<ConformanceCase> ConformanceCases(const ProcessGroupFactory& backend,
                                              const std::vector<int>& world_sizes);

// "<backend>_N<world_size>".
std::string ConformanceCaseName(const ::testing::TestParamInfo<ConformanceCase>& info);

// How gtest prints a case in its messages: "<backend> at N=<world_size>".
void PrintTo(const ConformanceCase& c, std::ostream* os);

class ProcessGroupConformanceTest : public ::testing::TestWithParam<ConformanceCase> {
 protected:
  void SetUp() override;

  // Deadline of each collective's Wait in the tests: generous for a loaded 2-core
  // machine, short enough that a hang fails well inside the test timeout.
  static constexpr absl::Duration kCollectiveTimeout = absl::Seconds(20);

  // Waits for `work` (at most kCollectiveTimeout): its error, or the issuing error.
  static absl::Status Finish(absl::StatusOr<std::shared_ptr<Work>> work);

  int n() const { return GetParam().world_size; }
  const ProcessGroupFactory& backend() const { return GetParam().backend; }
  // Runs `fn` on `world_size` rank threads (n() when 0), each with ctx.group set to its
  // rank of a new group from the factory over one fresh store; the first error, as
  // comm::testing::RunThreadRanks returns it.
  absl::Status RunRanks(const RankFunction& fn, int world_size = 0) const;
};

// Test values for backends' own tests, with the suite's conventions.

// A 1-d tensor of `n` elements of `dtype`, element i = f(i) (converted as the dtype
// stores it: rounded to bf16, truncated to int32).
core::Tensor FilledTensor(int64_t n, core::DType dtype, const std::function<float(int64_t)>& f);

// Element i of a 1-d tensor as its dtype stores it, widened to double.
double ElementAt(const core::Tensor& t, int64_t i);

// What `v` becomes when stored in `dtype`.
double StoredAs(core::DType dtype, float v);

}  // namespace testing
}  // namespace comm

#endif  // COMM_TESTING_PROCESS_GROUP_CONFORMANCE_H_
