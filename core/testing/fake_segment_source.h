// A SegmentSource for tests: segments from host memory (aligned_alloc), with counters of
// the calls and an optional cap that makes Allocate fail like a device out of memory.
//
//   auto counters = std::make_shared<core::testing::FakeSegmentSource::Counters>();
//   core::BlockPool pool(std::make_unique<core::testing::FakeSegmentSource>(counters));
//   ... counters->allocs is the number of "cudaMalloc" calls ...
#ifndef CORE_TESTING_FAKE_SEGMENT_SOURCE_H_
#define CORE_TESTING_FAKE_SEGMENT_SOURCE_H_

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/block_pool.h"

namespace core {
namespace testing {

class FakeSegmentSource : public SegmentSource {
 public:
  // Shared with the test, so they stay readable after the pool is gone.
  struct Counters {
    int allocs = 0;     // successful Allocate calls
    int frees = 0;      // Free calls
    int failures = 0;   // Allocate calls refused by the cap
    int bad_frees = 0;  // Free of an unknown segment or with a wrong size
    int64_t live_bytes = 0;
    std::map<char*, int64_t> live;
  };

  // `cap` > 0: Allocate fails with ResourceExhausted when live bytes would pass it.
  explicit FakeSegmentSource(std::shared_ptr<Counters> counters, int64_t cap = 0)
      : c_(std::move(counters)), cap_(cap) {}
  ~FakeSegmentSource() override {
    for (auto& [p, n] : c_->live) std::free(p);
    c_->live.clear();
  }

  absl::StatusOr<void*> Allocate(int64_t nbytes) override {
    if (cap_ > 0 && c_->live_bytes + nbytes > cap_) {
      ++c_->failures;
      return absl::ResourceExhaustedError("fake device out of memory");
    }
    void* p = std::aligned_alloc(512, static_cast<size_t>((nbytes + 511) / 512 * 512));
    if (p == nullptr) return absl::ResourceExhaustedError("host out of memory");
    ++c_->allocs;
    c_->live_bytes += nbytes;
    c_->live[static_cast<char*>(p)] = nbytes;
    return p;
  }

  void Free(void* ptr, int64_t nbytes) override {
    auto it = c_->live.find(static_cast<char*>(ptr));
    if (it == c_->live.end() || it->second != nbytes) {
      ++c_->bad_frees;
      return;
    }
    c_->live.erase(it);
    c_->live_bytes -= nbytes;
    ++c_->frees;
    std::free(ptr);
  }

  std::string Describe() const override { return "fake:0"; }

 private:
  std::shared_ptr<Counters> c_;
  int64_t cap_;
};

}  // namespace testing
}  // namespace core

#endif  // CORE_TESTING_FAKE_SEGMENT_SOURCE_H_
