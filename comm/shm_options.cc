#include "comm/shm_options.h"

namespace comm {

const char* ShmTransportName(ShmTransport transport) {
  switch (transport) {
    case ShmTransport::kAuto:
      return "auto";
    case ShmTransport::kSlots:
      return "slots";
    case ShmTransport::kCrossMemoryAttach:
      return "cma";
  }
  return "?";
}

}  // namespace comm
