// TokenFile: token ids read from the .bin files nanoGPT and llm.c write, memory-mapped, as
// one stream, cut into fixed windows; training batches by global index in epochs, so the
// global batch of a step is the same at every world size (data::RankSampler then gives each
// rank its rows), and evaluation batches that cover the stream once.
//
//   ASSIGN_OR_RETURN(data::TokenFile tokens, data::TokenFile::Open("data/shards"));
//   ASSIGN_OR_RETURN(data::TokenBatch batch,
//                    tokens.Batch(/*index=*/step, /*batch_size=*/32, /*seq_len=*/1024,
//                                 /*vocab_size=*/50304, /*seed=*/0));
//   // Evaluation: windows [b * 32, b * 32 + 32), the rows past the last window padding.
//   ASSIGN_OR_RETURN(data::WindowBatch eval, tokens.Windows(b * 32, 32, 1024, 50304));
//
// Layouts, told apart by the first 4 bytes:
//   - llm.c: a header of 256 little-endian int32 (magic 20240520 with version 1: uint16
//     tokens; magic 20240801 with version 7: uint32 tokens; header[2] = the token count),
//     then the tokens;
//   - nanoGPT: uint16 tokens and nothing else (any other first 4 bytes).
// A directory is read as its regular files ending in ".bin", in name order, one after
// another.
//
// NOTE [Token windows]: for a sequence length T the stream holds NumWindows(T) =
// floor((num_tokens - 1) / T) windows of T + 1 tokens, window w starting at token w T:
// inputs are its first T tokens, targets its last T, so consecutive windows share one token
// (the targets of w end where the inputs of w + 1 begin) and every token but the first is a
// target exactly once. A window may span two files; tokens after the last window are never
// read.
//
// Training (Batch) reads the windows in epochs, without replacement within one: row r of
// batch `index` of batch_size rows is global sample j = index * batch_size + r, in epoch
// e = j / W (W = NumWindows(T)), and reads window P_e(j mod W), where P_e is the
// data::Permutation of [0, W) keyed by (seed, e) (NOTE [Keyed permutation] in
// data/permutation.h). So every window is read once in each epoch, each epoch in another
// order, and nothing depends on the world size or on any batch before: the training
// checkpoint's step (with the batch size) is the whole of the data position, and a run
// resumed at step s (at any world size) reads batch s next.
//
// Evaluation (Windows) reads the windows in stream order: rows [first, first + rows) are
// windows first, first + 1, ...; a row at or past W is padding (inputs 0, targets
// kIgnoreTarget), so ceil(W / rows) batches cover the stream exactly once.
//
// NOTE [Token file fingerprint]: Fingerprint() identifies the stream's content cheaply
// enough for files of many GB, so a resume can check it reads the data it was trained on.
// It is a 64-bit FNV-1a hash over the number of files and, for each file in stream order,
// its size in bytes and a sample of its bytes (llm.c's header included): the first and
// the last kFingerprintEdgeBytes (64 KiB), and kFingerprintBlocks (16) blocks of
// kFingerprintEdgeBytes, each centred in one of 16 equal parts of what lies between. A file
// of at most 18 x 64 KiB (1.125 MiB) is hashed whole. It is NOT a hash of the whole
// content: in a larger file, a change outside the sampled blocks that keeps the size keeps
// the fingerprint. The paths are not in it (a moved copy has the same fingerprint); files
// without tokens are not part of the stream and not in it. Open computes it, reading at
// most 1.125 MiB of each file.
#ifndef DATA_TOKEN_FILE_H_
#define DATA_TOKEN_FILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/markov_language.h"  // TokenBatch

namespace data {

// The target of a padding row: nn::functional::CrossEntropy's default ignore_index, so the
// loss leaves it out (no loss, no gradient, not counted in the mean).
inline constexpr int32_t kIgnoreTarget = -100;

// An evaluation batch of TokenFile::Windows: `batch` has the rows asked for; its first
// `real_rows` are windows, the rest padding (NOTE [Token windows]).
struct WindowBatch {
  TokenBatch batch;
  int64_t real_rows = 0;
};

class TokenFile {
 public:
  // InvalidArgument naming the file for a header with a known magic but another version,
  // a token count that does not match the file's size (naming both), an odd-sized nanoGPT
  // file, a directory without .bin files, or an empty stream; NotFound naming a path that
  // does not exist; Internal with errno's text when a file cannot be opened or mapped.
  static absl::StatusOr<TokenFile> Open(const std::string& path);

  int64_t num_tokens() const { return total_; }
  // The files in stream order and each one's token count.
  std::vector<std::pair<std::string, int64_t>> Files() const;

  // NOTE [Token file fingerprint]: what it covers and what it does not.
  static constexpr int64_t kFingerprintEdgeBytes = int64_t{64} << 10;
  static constexpr int kFingerprintBlocks = 16;
  // The same for the same files (sizes and sampled bytes) in the same order; another
  // value, with overwhelming probability, when a sampled byte, a size or the order differs.
  uint64_t Fingerprint() const;

  // NOTE [Token windows]: windows of seq_len + 1 tokens in the stream; 0 when it holds
  // fewer than seq_len + 1 tokens or seq_len < 1.
  int64_t NumWindows(int seq_len) const;

  // The window training sample j reads (NOTE [Token windows]): P_e(j mod W), e = j / W.
  // InvalidArgument for sample < 0, seq_len < 1, or a stream without a window.
  absl::StatusOr<int64_t> TrainingWindow(int64_t sample, int seq_len, uint64_t seed) const;

  // Training batch `index` as NOTE [Token windows] says: row r is the window of sample
  // index * batch_size + r. InvalidArgument for index < 0, batch_size < 1, seq_len < 1, a
  // stream shorter than seq_len + 1 tokens, index * batch_size past 2^62, or a token >=
  // vocab_size (naming the file, the token's offset in tokens from the file's first token,
  // and its value).
  absl::StatusOr<TokenBatch> Batch(int64_t index, int batch_size, int seq_len, int64_t vocab_size,
                                   uint64_t seed) const;

  // Evaluation rows [first, first + rows): windows in stream order, the rows at or past
  // NumWindows(seq_len) padding (NOTE [Token windows]). InvalidArgument as Batch's for
  // first < 0, rows < 1, seq_len < 1, a stream without a window, or a token >= vocab_size.
  absl::StatusOr<WindowBatch> Windows(int64_t first, int rows, int seq_len,
                                      int64_t vocab_size) const;

 private:
  struct Shard;
  explicit TokenFile(std::vector<std::shared_ptr<const Shard>> shards);
  // Maps one file and reads its layout (errors as Open's).
  static absl::StatusOr<std::shared_ptr<Shard>> MapShard(const std::string& path);
  // The token at stream position p, and where it lives (for errors).
  uint32_t At(int64_t p, const Shard** shard, int64_t* offset) const;
  // Window w (NOTE [Token windows]) into out[0, seq_len + 1); InvalidArgument (Batch's) for
  // a token >= vocab_size.
  absl::Status ReadWindow(int64_t w, int seq_len, int64_t vocab_size, int32_t* out) const;

  std::vector<std::shared_ptr<const Shard>> shards_;
  std::vector<int64_t> starts_;  // stream position of each shard's first token
  int64_t total_ = 0;
};

}  // namespace data

#endif  // DATA_TOKEN_FILE_H_
