#include "comm/internal/sigpipe.h"

#include <pthread.h>
#include <time.h>

namespace comm {
namespace internal {
namespace {

sigset_t PipeSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  return set;
}

}  // namespace

ScopedBlockSigpipe::ScopedBlockSigpipe() {
  sigset_t set = PipeSet(), old;
  pthread_sigmask(SIG_BLOCK, &set, &old);
  was_blocked_ = sigismember(&old, SIGPIPE) == 1;
}

ScopedBlockSigpipe::~ScopedBlockSigpipe() {
  if (was_blocked_) return;
  sigset_t set = PipeSet();
  // Discard a SIGPIPE this thread raised while it was blocked (a process-directed one
  // pending for another reason would be taken too, which is what ignoring it means).
  sigset_t pending;
  sigpending(&pending);
  if (sigismember(&pending, SIGPIPE) == 1) {
    const timespec zero = {0, 0};
    while (sigtimedwait(&set, nullptr, &zero) == SIGPIPE) {
    }
  }
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

void BlockSigpipeForThisThread() {
  sigset_t set = PipeSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

}  // namespace internal
}  // namespace comm
