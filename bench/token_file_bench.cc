// token_file_bench: how fast a rank reads training batches from token files
// (data/token_file.h), beside a memcpy of the same bytes measured in the same run.
//
//   bazel run -c opt //bench:token_file_bench
//   bazel run -c opt //bench:token_file_bench -- --megabytes=1024 --batch=64 --seq_len=1024
//
// Writes a nanoGPT-layout file (uint16 tokens) of --megabytes under --dir, opens it
// (memory-mapped), reads it once so the page cache holds it, then times TokenFile::Batch
// for --batches global batches of --batch rows x (--seq_len + 1) tokens: each row a
// random window of the file, widened to int32 inputs and targets. Prints one JSON line:
// the token bytes read per second (2 bytes per token read from the file), batches per
// second, tokens per second, and memcpy's bytes per second over a buffer of the file's
// size as the machine's reference (issue 22's target: >= 1 GB/s per rank).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "data/token_file.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(int, megabytes, 256, "size of the token file to write and read");
ABSL_FLAG(std::string, dir, "/tmp", "where the token file is written (and removed after)");
ABSL_FLAG(int, batch, 64, "rows per batch");
ABSL_FLAG(int, seq_len, 1024, "tokens per row (each row reads seq_len + 1)");
ABSL_FLAG(int, batches, 200, "batches timed");

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

absl::StatusOr<nlohmann::json> Run() {
  const int64_t bytes = int64_t{absl::GetFlag(FLAGS_megabytes)} << 20;
  const int batch = absl::GetFlag(FLAGS_batch), seq_len = absl::GetFlag(FLAGS_seq_len);
  const int batches = absl::GetFlag(FLAGS_batches);
  if (bytes < 4 || batch < 1 || seq_len < 1 || batches < 1) {
    return absl::InvalidArgumentError("--megabytes, --batch, --seq_len and --batches must be >= 1");
  }
  const std::string path = absl::StrCat(absl::GetFlag(FLAGS_dir), "/token_file_bench.bin");
  {
    // nanoGPT layout: bare uint16 tokens (the first 4 bytes must not be llm.c's magic).
    std::vector<uint16_t> tokens(static_cast<size_t>(bytes / 2));
    for (size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = static_cast<uint16_t>((i * 2654435761u) % 50257);
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(tokens.data()),
              static_cast<std::streamsize>(tokens.size() * 2));
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  ASSIGN_OR_RETURN(data::TokenFile file, data::TokenFile::Open(path));
  // Warm the page cache: one pass over every token.
  ASSIGN_OR_RETURN(
      data::TokenBatch warm,
      file.Batch(0, 1, static_cast<int>(std::min<int64_t>(file.num_tokens() - 1, 1 << 20)), 50257,
                 0));
  (void)warm;
  {
    std::ifstream in(path, std::ios::binary);
    std::vector<char> sink(1 << 20);
    while (in.read(sink.data(), static_cast<std::streamsize>(sink.size()))) {
    }
  }
  const Clock::time_point t0 = Clock::now();
  for (int b = 0; b < batches; ++b) {
    ASSIGN_OR_RETURN(data::TokenBatch got, file.Batch(b, batch, seq_len, 50257, 7));
    (void)got;
  }
  const double read_s = Seconds(t0);
  const double tokens_read = static_cast<double>(batches) * batch * (seq_len + 1);
  // The reference: memcpy of a buffer as large as the file, in the same run.
  std::vector<char> src(static_cast<size_t>(bytes), 1), dst(static_cast<size_t>(bytes));
  std::memcpy(dst.data(), src.data(), src.size());  // fault the pages in
  const Clock::time_point t1 = Clock::now();
  const int copies = 4;
  for (int i = 0; i < copies; ++i) std::memcpy(dst.data(), src.data(), src.size());
  const double memcpy_s = Seconds(t1);
  std::remove(path.c_str());
  nlohmann::json out;
  out["benchmark"] = "token_file";
  out["file_bytes"] = bytes;
  out["batch"] = batch;
  out["seq_len"] = seq_len;
  out["batches"] = batches;
  out["token_bytes_per_second"] = 2 * tokens_read / read_s;
  out["tokens_per_second"] = tokens_read / read_s;
  out["batches_per_second"] = batches / read_s;
  out["memcpy_bytes_per_second"] = copies * static_cast<double>(bytes) / memcpy_s;
  out["token_bytes_over_memcpy"] =
      (2 * tokens_read / read_s) / (copies * static_cast<double>(bytes) / memcpy_s);
  out["target"] = "token_bytes_per_second >= 1e9 (per rank)";
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<nlohmann::json> out = Run();
  if (!out.ok()) {
    std::fprintf(stderr, "token_file_bench: %s\n", out.status().ToString().c_str());
    return 1;
  }
  std::printf("%s\n", out->dump().c_str());
  return 0;
}
