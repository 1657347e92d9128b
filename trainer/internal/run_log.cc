#include "trainer/internal/run_log.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace integration {
namespace internal {

absl::StatusOr<RunLog> RunLog::Open(const std::string& path, int restart, bool fresh) {
  RunLog log(path, restart);
  if (fresh) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) {
      return absl::InternalError(
          absl::StrCat("run log '", path, "': cannot create it: ", std::strerror(errno)));
    }
    std::fclose(f);
    return log;
  }
  std::string text;
  {
    std::ifstream in(path, std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // A start killed while appending leaves its last line torn: it is dropped, and cut from the
  // file so the next line starts on a line of its own.
  if (!text.empty() && text.back() != '\n') {
    text.resize(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
    std::FILE* f = std::fopen(path.c_str(), "w");
    const bool ok = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (f == nullptr || std::fclose(f) != 0 || !ok) {
      return absl::InternalError(absl::StrCat(
          "run log '", path, "': cannot cut its torn last line: ", std::strerror(errno)));
    }
  }
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    absl::Status applied = log.Apply(line);
    if (!applied.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("run log '", path, "' line ", number, ": ", applied.message()));
    }
  }
  if (!log.step_losses_.empty()) {
    log.reached_ = log.step_losses_.rbegin()->first;
    log.reached_time_ = log.step_times_[log.reached_];
  }
  return log;
}

absl::Status RunLog::Apply(const std::string& line) {
  const nlohmann::json e = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!e.is_object() || !e.contains("event") || !e["event"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("not a run log event: ", line));
  }
  const std::string event = e["event"];
  auto number = [&](const char* key) -> absl::StatusOr<double> {
    if (!e.contains(key) || !e[key].is_number()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the ", event, " event has no number \"", key, "\": ", line));
    }
    return e[key].get<double>();
  };
  if (event == "start") {
    ASSIGN_OR_RETURN(const double restart, number("restart"));
    ASSIGN_OR_RETURN(const double recomputed, number("recomputed"));
    if (restart > 0) {
      ++figures_.restarts;
      figures_.recomputed_per_restart.push_back(static_cast<int64_t>(recomputed));
    }
    figures_.steps_recomputed += static_cast<int64_t>(recomputed);
  } else if (event == "step") {
    ASSIGN_OR_RETURN(const double step, number("step"));
    ASSIGN_OR_RETURN(const double loss, number("loss"));
    ASSIGN_OR_RETURN(const double time, number("time"));
    step_losses_[static_cast<int64_t>(step)] = loss;
    step_times_[static_cast<int64_t>(step)] = time;
  } else if (event == "caught_up") {
    ASSIGN_OR_RETURN(const double lost, number("seconds_lost"));
    figures_.seconds_lost += lost;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown event \"", event, "\": ", line));
  }
  return absl::OkStatus();
}

absl::Status RunLog::Append(const std::string& line) {
  std::FILE* f = std::fopen(path_.c_str(), "a");
  bool ok = f != nullptr && std::fputs((line + "\n").c_str(), f) >= 0;
  const int error = errno;
  if (f != nullptr) ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    return absl::InternalError(
        absl::StrCat("run log '", path_, "': cannot append: ", std::strerror(error)));
  }
  return Apply(line);
}

absl::Status RunLog::Started(int64_t from_step, int world_size, double now) {
  const int64_t recomputed = std::max<int64_t>(0, reached_ - from_step);
  catching_up_ = recomputed > 0;
  return Append(absl::StrFormat(
      R"({"event":"start","restart":%d,"world_size":%d,"from_step":%d,"reached":%d,)"
      R"("recomputed":%d,"time":%.6f})",
      restart_, world_size, from_step, reached_, recomputed, now));
}

absl::Status RunLog::Reported(const Progress& progress, double now) {
  const int64_t first = progress.global_step - static_cast<int64_t>(progress.losses.size()) + 1;
  for (size_t i = 0; i < progress.losses.size(); ++i) {
    RETURN_IF_ERROR(Append(absl::StrFormat(
        R"({"event":"step","step":%d,"loss":%.17g,"committed":%d,"time":%.6f})",
        first + static_cast<int64_t>(i), progress.losses[i], progress.committed_step, now)));
  }
  if (catching_up_ && progress.global_step >= reached_) {
    catching_up_ = false;
    RETURN_IF_ERROR(
        Append(absl::StrFormat(R"({"event":"caught_up","step":%d,"seconds_lost":%.6f,"time":%.6f})",
                               progress.global_step, std::max(0.0, now - reached_time_), now)));
  }
  return absl::OkStatus();
}

std::string RunLog::ProgressSuffix() const {
  if (figures_.restarts == 0 && figures_.steps_recomputed == 0) return "";
  std::string suffix = absl::StrFormat("  restarts %d, %d steps recomputed", figures_.restarts,
                                       figures_.steps_recomputed);
  if (catching_up_) return absl::StrCat(suffix, ", recomputing to step ", reached_);
  return absl::StrCat(suffix, absl::StrFormat(", %.1f s lost", figures_.seconds_lost));
}

}  // namespace internal
}  // namespace integration
