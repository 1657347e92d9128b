// The ShmOptions of ShmProcessGroup's tests (comm/shm_process_group_test.cc,
// comm/shm_create_test.cc): small slots, so a case of "several slots" stays small, and
// a rendezvous timeout that fails a hang well inside the test's timeout.
//
//   ASSIGN_OR_RETURN(auto g, ShmProcessGroup::Create(store, rank, n, ShmTestOptions()));
#ifndef COMM_TESTING_SHM_TEST_OPTIONS_H_
#define COMM_TESTING_SHM_TEST_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "comm/shm_options.h"

namespace comm {
namespace testing {

// The tests' slot size: 4 KiB.
inline constexpr int64_t kShmTestSlotBytes = 4096;

// A group `name` with kShmTestSlotBytes slots, a 20 s rendezvous and `transport`;
// with forced cma, cma_min_bytes 0, so every size goes through process_vm_readv.
inline ShmOptions ShmTestOptions(const std::string& name = "shm",
                                 ShmTransport transport = ShmTransport::kAuto) {
  ShmOptions o;
  o.name = name;
  o.slot_bytes = kShmTestSlotBytes;
  o.rendezvous_timeout = absl::Seconds(20);
  o.transport = transport;
  if (transport == ShmTransport::kCrossMemoryAttach) o.cma_min_bytes = 0;
  return o;
}

}  // namespace testing
}  // namespace comm

#endif  // COMM_TESTING_SHM_TEST_OPTIONS_H_
