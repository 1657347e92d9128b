#include "data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/errno_text.h"
#include "core/random.h"
#include "core/status_macros.h"
#include "data/permutation.h"

namespace data {

namespace {

constexpr int32_t kLlmcMagic16 = 20240520;  // version 1: uint16 tokens
constexpr int32_t kLlmcMagic32 = 20240801;  // version 7: uint32 tokens
constexpr int64_t kLlmcHeaderBytes = 256 * 4;

constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

uint64_t FnvBytes(uint64_t h, const uint8_t* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
  return h;
}

uint64_t FnvWord(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * kFnvPrime;
  return h;
}

// NOTE [Token windows]: the order of epoch `epoch`'s windows, keyed by (seed, epoch).
absl::StatusOr<Permutation> EpochOrder(int64_t windows, uint64_t seed, int64_t epoch) {
  core::Rng rng = core::Rng(seed).Fork(static_cast<uint64_t>(epoch));
  return Permutation::Create(windows, rng.NextU64());
}

// NOTE [Token file fingerprint]: the hash of one file's sampled bytes.
uint64_t SampledBytesHash(const uint8_t* map, int64_t bytes) {
  const int64_t edge = TokenFile::kFingerprintEdgeBytes;
  const int64_t blocks = TokenFile::kFingerprintBlocks;
  if (bytes <= (blocks + 2) * edge) return FnvBytes(kFnvOffset, map, bytes);
  uint64_t h = FnvBytes(kFnvOffset, map, edge);
  // The middle, [edge, bytes - edge), in `blocks` equal parts of at least `edge` bytes each.
  const int64_t middle = bytes - 2 * edge;
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t centre = edge + middle * (2 * k + 1) / (2 * blocks);
    h = FnvBytes(h, map + centre - edge / 2, edge);
  }
  return FnvBytes(h, map + bytes - edge, edge);
}

}  // namespace

// One mapped file.
struct TokenFile::Shard {
  std::string path;
  const uint8_t* map = nullptr;
  size_t map_bytes = 0;
  uint64_t sampled_hash = 0;  // NOTE [Token file fingerprint]
  int64_t header_bytes = 0;
  int width = 2;  // bytes per token
  int64_t tokens = 0;

  ~Shard() {
    if (map != nullptr) ::munmap(const_cast<uint8_t*>(map), map_bytes);
  }
  uint32_t Token(int64_t i) const {
    const uint8_t* p = map + header_bytes + i * width;
    if (width == 2) {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
};

TokenFile::TokenFile(std::vector<std::shared_ptr<const Shard>> shards)
    : shards_(std::move(shards)) {
  for (const auto& s : shards_) {
    starts_.push_back(total_);
    total_ += s->tokens;
  }
}

std::vector<std::pair<std::string, int64_t>> TokenFile::Files() const {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& s : shards_) out.emplace_back(s->path, s->tokens);
  return out;
}

uint64_t TokenFile::Fingerprint() const {
  uint64_t h = FnvWord(kFnvOffset, shards_.size());
  for (const auto& s : shards_) {
    h = FnvWord(h, static_cast<uint64_t>(s->map_bytes));
    h = FnvWord(h, s->sampled_hash);
  }
  return h;
}

uint32_t TokenFile::At(int64_t p, const Shard** shard, int64_t* offset) const {
  const size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), p) -
                                       starts_.begin() - 1);
  *shard = shards_[i].get();
  *offset = p - starts_[i];
  return shards_[i]->Token(*offset);
}

absl::StatusOr<TokenFile> TokenFile::Open(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) {
    return absl::NotFoundError(absl::StrCat("TokenFile::Open: '", path, "' does not exist"));
  }
  std::vector<std::string> paths;
  if (std::filesystem::is_directory(st)) {
    for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
      if (e.is_regular_file() && absl::EndsWith(e.path().filename().string(), ".bin")) {
        paths.push_back(e.path().string());
      }
    }
    if (ec) {
      return absl::InternalError(
          absl::StrCat("TokenFile::Open: cannot list '", path, "': ", ec.message()));
    }
    std::sort(paths.begin(), paths.end());
    if (paths.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("TokenFile::Open: directory '", path, "' has no .bin files"));
    }
  } else {
    paths.push_back(path);
  }
  std::vector<std::shared_ptr<const Shard>> shards;
  for (const std::string& p : paths) {
    ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, MapShard(p));
    if (shard->tokens > 0) shards.push_back(std::move(shard));
  }
  if (shards.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TokenFile::Open: '", path, "' holds no tokens"));
  }
  return TokenFile(std::move(shards));
}

int64_t TokenFile::NumWindows(int seq_len) const {
  if (seq_len < 1 || total_ < int64_t{seq_len} + 1) return 0;
  return (total_ - 1) / seq_len;
}

absl::StatusOr<int64_t> TokenFile::TrainingWindow(int64_t sample, int seq_len,
                                                  uint64_t seed) const {
  const int64_t windows = NumWindows(seq_len);
  if (sample < 0 || windows < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TokenFile::TrainingWindow: sample ", sample, " with seq_len ", seq_len, " over ", total_,
        " tokens (", windows, " windows); need sample >= 0 and a window"));
  }
  ASSIGN_OR_RETURN(const Permutation order, EpochOrder(windows, seed, sample / windows));
  return order.At(sample % windows);
}

absl::Status TokenFile::ReadWindow(int64_t w, int seq_len, int64_t vocab_size, int32_t* out) const {
  const int64_t window = int64_t{seq_len} + 1;
  const int64_t start = w * seq_len;
  // The window in runs, one per file it touches, each a tight loop over the mapping.
  uint32_t largest = 0;
  for (int64_t j = 0; j < window;) {
    const int64_t p = start + j;
    const size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), p) -
                                         starts_.begin() - 1);
    const Shard& shard = *shards_[i];
    const int64_t first = p - starts_[i];
    const int64_t n = std::min(window - j, shard.tokens - first);
    const uint8_t* src = shard.map + shard.header_bytes + first * shard.width;
    int32_t* dst = out + j;
    if (shard.width == 2) {
      for (int64_t k = 0; k < n; ++k) {
        uint16_t v;
        std::memcpy(&v, src + 2 * k, 2);
        dst[k] = v;
        largest = std::max<uint32_t>(largest, v);
      }
    } else {
      for (int64_t k = 0; k < n; ++k) {
        uint32_t v;
        std::memcpy(&v, src + 4 * k, 4);
        dst[k] = static_cast<int32_t>(v);
        largest = std::max(largest, v);
      }
    }
    j += n;
  }
  if (largest < static_cast<uint64_t>(vocab_size)) return absl::OkStatus();
  // Name the first offending token (the slow path, on error only).
  for (int64_t j = 0; j < window; ++j) {
    const Shard* shard = nullptr;
    int64_t offset = 0;
    const uint32_t token = At(start + j, &shard, &offset);
    if (token >= static_cast<uint64_t>(vocab_size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("TokenFile::Batch: token ", token, " at token offset ", offset, " of '",
                       shard->path, "' is not below the model's vocabulary size ", vocab_size));
    }
  }
  return absl::OkStatus();
}

namespace {

// An int32 [rows, seq_len] tensor for inputs or targets.
absl::StatusOr<core::Tensor> Rows(int64_t rows, int64_t seq_len) {
  return core::Tensor::Allocate({rows, seq_len}, core::DType::kInt32, core::MemoryTag::kOther);
}

}  // namespace

absl::StatusOr<TokenBatch> TokenFile::Batch(int64_t index, int batch_size, int seq_len,
                                            int64_t vocab_size, uint64_t seed) const {
  if (index < 0 || batch_size < 1 || seq_len < 1 || vocab_size < 1 ||
      index > ((int64_t{1} << 62) - batch_size) / batch_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("TokenFile::Batch: index ", index, ", batch_size ", batch_size, ", seq_len ",
                     seq_len, ", vocab_size ", vocab_size,
                     "; need index >= 0, the others >= 1 and (index + 1) * batch_size <= 2^62"));
  }
  const int64_t window = int64_t{seq_len} + 1;
  if (total_ < window) {
    return absl::InvalidArgumentError(absl::StrCat("TokenFile::Batch: the stream has ", total_,
                                                   " tokens, fewer than seq_len + 1 = ", window));
  }
  const int64_t b = batch_size, t = seq_len;
  ASSIGN_OR_RETURN(core::Tensor inputs, Rows(b, t));
  ASSIGN_OR_RETURN(core::Tensor targets, Rows(b, t));
  int32_t* in = inputs.data<int32_t>();
  int32_t* tg = targets.data<int32_t>();
  // NOTE [Token windows]: samples index * b + r, in epochs of W windows; the permutation of
  // an epoch is made once per batch (a batch spans at most a few epochs).
  const int64_t windows = NumWindows(seq_len);
  std::optional<Permutation> order;
  int64_t order_epoch = -1;
  std::vector<int32_t> row_tokens(static_cast<size_t>(window));
  for (int64_t r = 0; r < b; ++r) {
    const int64_t sample = index * b + r;
    const int64_t epoch = sample / windows;
    if (epoch != order_epoch) {
      ASSIGN_OR_RETURN(order, EpochOrder(windows, seed, epoch));
      order_epoch = epoch;
    }
    RETURN_IF_ERROR(
        ReadWindow(order->At(sample % windows), seq_len, vocab_size, row_tokens.data()));
    std::memcpy(in + r * t, row_tokens.data(), static_cast<size_t>(t) * sizeof(int32_t));
    std::memcpy(tg + r * t, row_tokens.data() + 1, static_cast<size_t>(t) * sizeof(int32_t));
  }
  return TokenBatch{std::move(inputs), std::move(targets)};
}

absl::StatusOr<WindowBatch> TokenFile::Windows(int64_t first, int rows, int seq_len,
                                               int64_t vocab_size) const {
  const int64_t windows = NumWindows(seq_len);
  if (first < 0 || rows < 1 || seq_len < 1 || vocab_size < 1 || windows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("TokenFile::Windows: first ", first, ", rows ", rows, ", seq_len ", seq_len,
                     ", vocab_size ", vocab_size, " over ", total_, " tokens (", windows,
                     " windows); need first >= 0, the others >= 1 and at least one window"));
  }
  const int64_t b = rows, t = seq_len;
  ASSIGN_OR_RETURN(core::Tensor inputs, Rows(b, t));
  ASSIGN_OR_RETURN(core::Tensor targets, Rows(b, t));
  int32_t* in = inputs.data<int32_t>();
  int32_t* tg = targets.data<int32_t>();
  WindowBatch out;
  out.real_rows = std::clamp<int64_t>(windows - first, 0, b);
  std::vector<int32_t> row_tokens(static_cast<size_t>(t + 1));
  for (int64_t r = 0; r < b; ++r) {
    if (r < out.real_rows) {
      RETURN_IF_ERROR(ReadWindow(first + r, seq_len, vocab_size, row_tokens.data()));
      std::memcpy(in + r * t, row_tokens.data(), static_cast<size_t>(t) * sizeof(int32_t));
      std::memcpy(tg + r * t, row_tokens.data() + 1, static_cast<size_t>(t) * sizeof(int32_t));
    } else {
      std::fill(in + r * t, in + (r + 1) * t, 0);
      std::fill(tg + r * t, tg + (r + 1) * t, kIgnoreTarget);
    }
  }
  out.batch = TokenBatch{std::move(inputs), std::move(targets)};
  return out;
}

absl::StatusOr<std::shared_ptr<TokenFile::Shard>> TokenFile::MapShard(const std::string& path) {
  auto shard = std::make_shared<Shard>();
  shard->path = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("TokenFile::Open: cannot open '", path, "': ", core::ErrnoText(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(
        absl::StrCat("TokenFile::Open: cannot stat '", path, "': ", core::ErrnoText(err)));
  }
  const int64_t bytes = st.st_size;
  if (bytes > 0) {
    void* m = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(
          absl::StrCat("TokenFile::Open: cannot map '", path, "': ", core::ErrnoText(err)));
    }
    shard->map = static_cast<const uint8_t*>(m);
    shard->map_bytes = static_cast<size_t>(bytes);
  }
  ::close(fd);
  shard->sampled_hash = SampledBytesHash(shard->map, bytes);
  int32_t head[3] = {0, 0, 0};
  if (bytes >= 12) std::memcpy(head, shard->map, sizeof(head));
  if (bytes >= 4 && (head[0] == kLlmcMagic16 || head[0] == kLlmcMagic32)) {
    const bool wide = head[0] == kLlmcMagic32;
    const int32_t want_version = wide ? 7 : 1;
    if (bytes < kLlmcHeaderBytes || head[1] != want_version) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TokenFile::Open: '", path, "' has llm.c's magic ", head[0], " but ",
          bytes < kLlmcHeaderBytes ? absl::StrCat("only ", bytes, " bytes, less than its header")
                                   : absl::StrCat("version ", head[1], ", not ", want_version)));
    }
    shard->width = wide ? 4 : 2;
    shard->header_bytes = kLlmcHeaderBytes;
    shard->tokens = head[2];
    const int64_t body = bytes - kLlmcHeaderBytes;
    if (head[2] < 0 || body != int64_t{head[2]} * shard->width) {
      return absl::InvalidArgumentError(
          absl::StrCat("TokenFile::Open: '", path, "': its header counts ", head[2], " tokens of ",
                       shard->width, " bytes but ", body, " bytes follow the header"));
    }
    return shard;
  }
  if (bytes % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("TokenFile::Open: '", path, "' has no llm.c header and an odd size (", bytes,
                     " bytes), so it is not nanoGPT's uint16 tokens either"));
  }
  shard->tokens = bytes / 2;
  return shard;
}

}  // namespace data
