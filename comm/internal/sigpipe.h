// Gloo writes to its sockets without MSG_NOSIGNAL, so a peer that dies can raise
// SIGPIPE, whose default action kills the whole process (PyTorch does not see this
// only because Python ignores SIGPIPE). Rather than change the process-wide signal
// disposition, comm blocks SIGPIPE in the threads that do gloo I/O: then the write
// fails with EPIPE, which gloo reports as an error we turn into a Status.
#ifndef COMM_INTERNAL_SIGPIPE_H_
#define COMM_INTERNAL_SIGPIPE_H_

#include <signal.h>

namespace comm {
namespace internal {

// Blocks SIGPIPE on this thread for the object's lifetime. Threads started meanwhile
// inherit the blocked mask for good (gloo's event-loop thread, our worker thread).
// On destruction a SIGPIPE raised meanwhile is discarded and the mask restored.
class ScopedBlockSigpipe {
 public:
  ScopedBlockSigpipe();
  ~ScopedBlockSigpipe();
  ScopedBlockSigpipe(const ScopedBlockSigpipe&) = delete;
  ScopedBlockSigpipe& operator=(const ScopedBlockSigpipe&) = delete;

 private:
  bool was_blocked_ = false;
};

// Blocks SIGPIPE on this thread for the rest of its life.
void BlockSigpipeForThisThread();

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_SIGPIPE_H_
