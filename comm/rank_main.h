// RankMain: the main() of a program that runs as several ranks of itself. Started by hand, it
// starts `world_size` copies of itself on this machine (comm::RunLocalRanks) and returns
// their launcher's exit status; started by a launcher (comm/launcher.h, torchrun, srun,
// mpirun: comm::IsLaunchedRank), it joins the job (comm::InitFromEnv) and runs `rank`.
//
//   int main(int argc, char** argv) {
//     absl::ParseCommandLine(argc, argv);
//     return comm::RankMain("train", absl::GetFlag(FLAGS_world_size), argc, argv,
//                           [](const comm::Distributed& dist) { return Train(dist.group); });
//   }
#ifndef COMM_RANK_MAIN_H_
#define COMM_RANK_MAIN_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "comm/init_from_env.h"

namespace comm {

// The exit status: 0 when every rank succeeded. A failure prints "<name>: <error>" (with the
// rank, "<name> (rank <r>): <error>", in a rank) to stderr and returns 1 (the launcher's own
// status, naming the root cause, when a rank fails).
int RankMain(const std::string& name, int world_size, int argc, char** argv,
             const std::function<absl::Status(const Distributed&)>& rank,
             const InitOptions& init = {});

}  // namespace comm

#endif  // COMM_RANK_MAIN_H_
