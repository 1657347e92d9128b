// TokenFile: token ids read from the .bin files nanoGPT and llm.c write, memory-mapped, as
// one stream; batches sampled by global index, so the global batch of a step is the same
// at every world size (data::RankSampler then gives each rank its rows).
//
//   ASSIGN_OR_RETURN(data::TokenFile tokens, data::TokenFile::Open("data/shards"));
//   ASSIGN_OR_RETURN(data::TokenBatch batch,
//                    tokens.Batch(/*index=*/step, /*batch_size=*/32, /*seq_len=*/1024,
//                                 /*vocab_size=*/50304, /*seed=*/0));
//
// Layouts, told apart by the first 4 bytes:
//   - llm.c: a header of 256 little-endian int32 (magic 20240520 with version 1: uint16
//     tokens; magic 20240801 with version 7: uint32 tokens; header[2] = the token count),
//     then the tokens;
//   - nanoGPT: uint16 tokens and nothing else (any other first 4 bytes).
// A directory is read as its regular files ending in ".bin", in name order, one after
// another.
//
// Batch `index` row r is the T + 1 tokens from a position drawn from (seed, index, r)
// uniformly over the stream: inputs are the first T, targets the last T. A window may span
// two files. The training checkpoint's step is the whole of the data position: a run
// resumed at step s (at any world size) reads batch s next.
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

  // Rows as the top of this file says. InvalidArgument for index < 0, batch_size < 1,
  // seq_len < 1, a stream shorter than seq_len + 1 tokens, or a sampled token >= vocab_size
  // (naming the file, the token's offset in tokens from the file's first token, and its
  // value).
  absl::StatusOr<TokenBatch> Batch(int64_t index, int batch_size, int seq_len,
                                   int64_t vocab_size, uint64_t seed) const;

 private:
  struct Shard;
  explicit TokenFile(std::vector<std::shared_ptr<const Shard>> shards);
  // Maps one file and reads its layout (errors as Open's).
  static absl::StatusOr<std::shared_ptr<Shard>> MapShard(const std::string& path);
  // The token at stream position p, and where it lives (for errors).
  uint32_t At(int64_t p, const Shard** shard, int64_t* offset) const;

  std::vector<std::shared_ptr<const Shard>> shards_;
  std::vector<int64_t> starts_;  // stream position of each shard's first token
  int64_t total_ = 0;
};

}  // namespace data

#endif  // DATA_TOKEN_FILE_H_
