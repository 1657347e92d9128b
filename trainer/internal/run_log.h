// NOTE [Run log]: the main job's record of every start of a run, which is what lets a
// restarted run say what its failures cost. Rank 0 appends one JSON object per line to
// <output_dir>/run_log.jsonl:
//   {"event":"start","restart":1,"world_size":2,"from_step":40,"reached":47,"recomputed":7,
//    "time":1796280000.25}
//   {"event":"step","step":41,"loss":2.4431772232055664,"committed":40,"time":1796280001.5}
//   {"event":"caught_up","step":47,"seconds_lost":6.75,"time":1796280003.0}
// "restart" is the launcher's restart count (FSDP_RESTART_COUNT, NOTE [Restarts] in
// comm/launcher.h), "reached" the highest step any earlier start logged, "recomputed" the steps
// this start trains again (reached - from_step: the work the failure lost), a step event's
// loss the global mean loss printed with every digit (%.17g) and its "committed" the step of
// the newest checkpoint the fit had committed by then (Progress::committed_step; -1: none).
// "caught_up" is logged at this start's first progress report at or past `reached`: seconds_lost is
// how much later the run got there than the earlier start did (the failure, its detection, the
// restart, the resume and the recomputed steps; up to one report interval more when the report
// falls past `reached`). A first start without a resume empties the file; a restart, or a run
// resumed by hand, adds to it. The last step event of a step is the loss the finished run trained
// with.
//
//   ASSIGN_OR_RETURN(RunLog log, RunLog::Open(dir + "/run_log.jsonl", restart, fresh));
//   log.Started(from_step, world_size, now);
//   runner->set_progress_callback([&](const Progress& p) {
//     log.Reported(p, absl::ToUnixMicros(absl::Now()) / 1e6);
//     say(FormatProgress(p) + log.ProgressSuffix());
//   });
//   summary["restarts"] = log.figures().restarts;
#ifndef TRAINER_INTERNAL_RUN_LOG_H_
#define TRAINER_INTERNAL_RUN_LOG_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "integration/stage_runner.h"

namespace integration {
namespace internal {

// The run log's file name in the output directory.
inline constexpr char kRunLogFile[] = "run_log.jsonl";

// What the failures of a run cost, over every start in its log.
struct RestartFigures {
  int restarts = 0;              // starts with a restart count > 0
  int64_t steps_recomputed = 0;  // sum of the starts' "recomputed"
  double seconds_lost = 0;       // sum of the "caught_up" events' seconds_lost
  // Per restart, in order: the steps it recomputed (the work lost to the failure before it).
  std::vector<int64_t> recomputed_per_restart;
};

class RunLog {
 public:
  // Reads `path` (a missing file is an empty log) unless `fresh`, in which case the log starts
  // over. InvalidArgument naming the file and the line for a line that is not one of the
  // events above; Internal with errno's text when the file cannot be written.
  static absl::StatusOr<RunLog> Open(const std::string& path, int restart, bool fresh);

  // Logs this start: training resumes after global step `from_step` on `world_size` ranks.
  absl::Status Started(int64_t from_step, int world_size, double now);
  // Logs the steps of a progress report (Progress::losses) and, once this start passes the
  // step the earlier ones reached, what getting there again cost.
  absl::Status Reported(const Progress& progress, double now);

  // "" on a run without restarts or recomputed steps, else
  // "  restarts 1, 7 steps recomputed, 6.8 s lost" ("... recomputing to step 47" until the
  // start has caught up).
  std::string ProgressSuffix() const;
  const RestartFigures& figures() const { return figures_; }
  // Every step's loss as the log's last event for it gives it (the finished run's losses).
  const std::map<int64_t, double>& step_losses() const { return step_losses_; }
  const std::string& path() const { return path_; }

 private:
  RunLog(std::string path, int restart) : path_(std::move(path)), restart_(restart) {}
  absl::Status Append(const std::string& line);
  // Folds one event (a parsed line, or one this start logs) into the figures.
  absl::Status Apply(const std::string& line);

  std::string path_;
  int restart_ = 0;
  RestartFigures figures_;
  std::map<int64_t, double> step_losses_;
  std::map<int64_t, double> step_times_;  // when the step was last reported
  int64_t reached_ = 0;                   // highest step logged before this start
  double reached_time_ = 0;               // when it was logged
  bool catching_up_ = false;              // this start recomputes steps and has not caught up
};

}  // namespace internal
}  // namespace integration

#endif  // TRAINER_INTERNAL_RUN_LOG_H_
