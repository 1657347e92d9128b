#include "comm/rank_main.h"

#include <cstdio>
#include <vector>

#include "comm/launcher.h"

namespace comm {

int RankMain(const std::string& name, int world_size, int argc, char** argv,
             const std::function<absl::Status(const Distributed&)>& rank, const InitOptions& init) {
  if (!IsLaunchedRank()) {
    absl::StatusOr<int> code =
        RunLocalRanks(world_size, std::vector<std::string>(argv + 1, argv + argc));
    if (!code.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), code.status().ToString().c_str());
      return 1;
    }
    return *code;
  }
  absl::StatusOr<Distributed> dist = InitFromEnv(init);
  if (!dist.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), dist.status().ToString().c_str());
    return 1;
  }
  const absl::Status s = rank(*dist);
  if (!s.ok()) {
    std::fprintf(stderr, "%s (rank %d): %s\n", name.c_str(), dist->group->rank(),
                 s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace comm
