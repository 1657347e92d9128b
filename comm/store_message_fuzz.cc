// Fuzz target for the TcpStore server's message parser: raw bytes, as a client could
// send them, go through the frame assembler (with both the handshake limit and the
// request limit) and every complete frame through the handshake and request parsers.
// Nothing may crash, hang, allocate by an announced length, or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <string>

#include "comm/internal/store_protocol.h"

namespace {

// Feeds `data` in pieces of varying size, as recv would hand it over.
void Assemble(absl::string_view data, size_t max_frame, bool handshake) {
  comm::internal::FrameAssembler in(max_frame);
  size_t step = 1;
  while (!data.empty()) {
    absl::StatusOr<size_t> used = in.Consume(data.substr(0, step));
    if (!used.ok()) return;  // oversized announcement: the server closes here
    data.remove_prefix(*used);
    step = step % 7 + 1;
    if (in.BodyBytes() > max_frame) __builtin_trap();  // buffered past the limit
    if (!in.HasFrame()) continue;
    const std::string frame = in.TakeFrame();
    if (handshake) {
      (void)comm::internal::ParseAuthProof(frame);
      (void)comm::internal::ParseHello(frame);
    } else {
      absl::StatusOr<comm::internal::Request> req = comm::internal::ParseRequest(frame);
      if (req.ok()) {
        // What parses must encode back to the same bytes (the format has one spelling).
        if (comm::internal::EncodeRequest(*req) != frame) __builtin_trap();
      }
      (void)comm::internal::ParseReply(frame);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  Assemble(bytes, comm::internal::kStoreMaxHandshakeBytes, /*handshake=*/true);
  Assemble(bytes, size_t{1} << 20, /*handshake=*/false);
  // The whole input as one payload, as if it had arrived in one frame.
  absl::StatusOr<comm::internal::Request> req = comm::internal::ParseRequest(bytes);
  if (req.ok() && comm::internal::EncodeRequest(*req) != bytes) __builtin_trap();
  return 0;
}
