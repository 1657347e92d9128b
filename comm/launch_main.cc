// launch: starts N local ranks of a program with the torchrun environment. See
// comm/launcher.h for the contract.
//
//   launch --nproc=4 [--master_addr=127.0.0.1] [--master_port=29500] [--grace_period_s=5] \
//       -- program args...
#include <string>
#include <vector>

#include "comm/launcher.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<comm::LaunchOptions> options = comm::ParseLaunchArgs(args);
  if (!options.ok()) {
    const std::string msg = std::string(options.status().message()) + "\n";
    fputs(msg.c_str(), stderr);
    return 2;
  }
  return comm::Launch(*options);
}
