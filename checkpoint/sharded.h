// Sharded checkpoints: every rank writes the tensor slices it holds into its own data
// file of one checkpoint directory, and any number of ranks (any world size) loads it
// back, each reading only the byte ranges it asks for.
//
// Where each part of checkpointing lives (integration/checkpointing builds on the other two):
// - checkpoint/ (this package): the sharded format and its Save / Load (this file), the
//   series of step checkpoints under one root (series.h), safetensors files
//   (safetensors.h) and Hugging Face GPT-2 and Llama directories in and out (hf_model.h,
//   hf_gpt2.h, hf_llama.h). It knows tensors, slices and modules, not training.
// - integration/checkpointing/: training checkpoints, a wrapped model's shards plus its
//   optimizer's state plus the training record (model structure, optimizer counters, data
//   identity and position) in one checkpoint of this format, loaded back at any world size
//   or into a plain module (training_checkpoint.h, model_structure.h, data_identity.h).
// - fsdp/state_dict.h: the state dict FSDP gives and takes, full or sharded (each rank's
//   slices with where they sit), which the two above write and read.
//
//   // Saving (collective: every rank calls it, in the same order, with its slices).
//   std::vector<checkpoint::TensorSlice> local;
//   local.push_back({"fc.weight", {4, 5}, core::DType::kFloat32, begin, end, shard_view});
//   local.push_back(checkpoint::FullSlice("optim.step", step_tensor));  // replicated
//   checkpoint::SaveOptions options;
//   options.step = 1000;
//   RETURN_IF_ERROR(checkpoint::Save("/ckpt/step-1000", local, options, group.get()));
//
//   // Loading at another world size: plan from the metadata, then read.
//   ASSIGN_OR_RETURN(checkpoint::CheckpointInfo info, checkpoint::ReadMetadata(dir));
//   core::Tensor mine = core::Tensor::Empty({end - begin});
//   ASSIGN_OR_RETURN(checkpoint::LoadStats stats,
//                    checkpoint::Load(dir, {{"fc.weight", begin, end, mine}}));
//
// Layout (checkpoint/checkpoint.proto): `<dir>/metadata.pb` lists each tensor's name,
// full shape, dtype and chunks (file, flat element range, byte range, CRC32C per
// block) behind a checksummed header; `<dir>/rank-RRRRR-of-WWWWW.bin` holds rank R's
// chunks back to back as raw little-endian elements. Every byte of every file is
// covered by a checksum that is verified before the byte is used (NOTE [Checksum
// coverage] in checkpoint.proto).
//
// NOTE [Checkpoint commit]: Save builds the whole directory under a fresh temporary
// name beside it, `<dir>.tmp-<16 hex digits>` (created with mkdir, so two saves never
// share one), every rank fsyncs its file, rank 0 writes and fsyncs metadata.pb, then
// rank 0 swaps the temporary directory into `<dir>` (renameat2 RENAME_EXCHANGE where
// the filesystem has it, else rename the old one aside first) and deletes the old one.
// A crash at any point leaves at `<dir>` either the previous complete checkpoint or the
// new complete one, plus temporaries that the next Save (or CleanUpInterruptedSaves)
// deletes. (Only on a
// filesystem without RENAME_EXCHANGE is there a window, between two renames, where
// `<dir>` is missing and the previous checkpoint sits complete at `<dir>.old-<hex>`, where
// the next Save or CleanUpInterruptedSaves puts it back.)
// All ranks must see one shared filesystem at `dir`.
//
// NOTE [Save lock]: rank 0 holds an exclusive flock on `<dir>.lock` (beside `<dir>`,
// removed when released) for the whole of Save, and CleanUpInterruptedSaves takes it
// too. So while rank 0 holds it no other Save to `dir` is running, and every
// `<dir>.tmp-*` / `<dir>.old-*` is the leftover of an interrupted one: Save deletes
// them before it writes (a dead process's flock is released by the kernel).
//
// NOTE [Replicated slices]: several ranks may hold the same elements of a tensor
// (NO_SHARD parameters, step counters: every rank has the full range). Each element is
// written once, by the lowest rank that holds it; the copies are assumed equal and
// are not compared. Together the ranks must hold every element of every tensor.
#ifndef CHECKPOINT_SHARDED_H_
#define CHECKPOINT_SHARDED_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "checkpoint/format.h"
#include "comm/process_group.h"
#include "core/allocator.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace checkpoint {

// kFormatVersion, kMetadataFileName, kDefaultBlockBytes, kMaxBlockBytes: checkpoint/format.h.

// The part of one tensor a rank holds: elements [begin, end) of the tensor `name` of
// full shape `shape`, flattened row-major. `data` holds exactly end - begin elements
// (any shape of that numel, read flat; any device). The checkpoint stores the elements
// as `dtype`; `data` may be fp32 or bf16 when `dtype` is the other (it is converted),
// int32 only for int32. An empty range (begin == end) is allowed and writes nothing.
struct TensorSlice {
  std::string name;
  core::Shape shape;
  core::DType dtype = core::DType::kFloat32;
  int64_t begin = 0;
  int64_t end = 0;
  core::Tensor data;
};

// A slice covering all of `tensor` (its shape, dtype and every element): for tensors
// every rank holds in full.
TensorSlice FullSlice(std::string name, const core::Tensor& tensor);

// Test hook: where Save stops as if the process had crashed, leaving whatever it wrote.
enum class SimulatedCrash {
  kNone,
  // After every data file is written, before metadata.pb.
  kBeforeMetadata,
  // With the temporary directory complete, before it is moved into place.
  kBeforeRename,
  // With the new checkpoint in place, before the previous one is deleted.
  kAfterRename,
};

struct SaveOptions {
  // Recorded in the metadata (CheckpointInfo::step, user_metadata); rank 0's values
  // are the ones kept.
  int64_t step = 0;
  std::map<std::string, std::string> user_metadata;
  // Typed records of the layers above: name -> serialized protobuf message (any bytes),
  // kept under the metadata checksum (CheckpointMetadata.records); rank 0's are kept.
  std::map<std::string, std::string> records;
  // Checksum block size in bytes: a reader verifies (and reads) whole blocks, so this
  // bounds how much more than the requested bytes a load reads. In
  // [1, kMaxBlockBytes].
  int64_t block_bytes = kDefaultBlockBytes;
  // Deadline of each collective step of Save. Rank 0 waits at most half of it for
  // NOTE [Save lock].
  absl::Duration timeout = comm::kDefaultCollectiveTimeout;
  // Test hook; Save returns Aborted naming the crash point when it is not kNone.
  SimulatedCrash simulate_crash = SimulatedCrash::kNone;
  // Test hook: when not OK, this rank's data file is not written and this is its error (a
  // full disk, say), on the background thread of NOTE [Asynchronous save] when there is one.
  absl::Status simulate_write_error;
};

// Writes the union of every rank's `local` slices as the checkpoint `dir` (see NOTE
// [Checkpoint commit] and NOTE [Replicated slices]); missing parent directories are
// created, an existing checkpoint at `dir` is replaced. Collective over `group`: every
// rank calls it, in the same order relative to the group's other collectives; with
// group == nullptr it is a world of one. Every rank returns the same status: OK once
// the checkpoint is in place, otherwise the first failing rank's error, prefixed
// "rank <r>: ". InvalidArgument naming the tensor for a slice whose range, data size or
// dtype does not fit, a name listed twice by one rank, ranks disagreeing on a tensor's
// shape or dtype, or elements no rank holds (naming the range); InvalidArgument naming
// SaveOptions.block_bytes outside [1, kMaxBlockBytes]; DeadlineExceeded naming
// `<dir>.lock` when another Save to `dir` holds it past timeout / 2. Before writing,
// rank 0 deletes what interrupted saves left beside `dir` (NOTE [Save lock]). On any
// error `dir` is untouched and this save's temporary directory is deleted (unless a
// SimulatedCrash kept it, or rank 0 itself died).
absl::Status Save(const std::string& dir, const std::vector<TensorSlice>& local,
                  const SaveOptions& options = SaveOptions(), comm::ProcessGroup* group = nullptr);

// NOTE [Asynchronous save]: Save in two calls, so that writing can overlap the caller's work.
// BeginSave runs Save's first phase (the slices validated, rank 0's NOTE [Save lock] taken and
// its temporary directory made, the plan exchanged) and, with `background`, copies every slice
// into host memory of its own (converted to its stored dtype; a pinned buffer, synchronising
// with the device, for a CUDA tensor: the snapshot) and writes and fsyncs this rank's data
// file on a thread of its own; the caller may change its tensors as soon as BeginSave returns.
// PendingSave::Finish waits for that write and runs the rest (every rank's chunk lists
// exchanged; rank 0's metadata.pb and commit; the result exchanged). Nothing is committed
// before Finish; every rank's Finish returns the same status, the first failing rank's error
// (a write that failed in the background included); a failure leaves the previous checkpoint
// at `dir` intact and removes the temporary directory, as Save does. Both calls are
// collective. Without `background` nothing is copied and Finish writes the file itself: Save
// is BeginSave(..., false) then Finish. The snapshot costs a copy of this rank's slices in
// host memory until Finish.
class PendingSave {
 public:
  struct State;
  explicit PendingSave(std::unique_ptr<State> state);
  // Finish not called (an error elsewhere): waits for the write, then rank 0 deletes the
  // temporary directory; nothing is committed. Not collective.
  ~PendingSave();
  PendingSave(const PendingSave&) = delete;
  PendingSave& operator=(const PendingSave&) = delete;

  // True once this rank's background write has ended (or without one); never blocks.
  bool WriteDone() const;
  // The rest of the save (see above); FailedPrecondition when called twice.
  absl::Status Finish();
  const std::string& dir() const;

 private:
  std::unique_ptr<State> state_;
};

// Errors as Save's first phase (then every rank returns the same one); a snapshot that
// cannot be made is this rank's error at Finish.
absl::StatusOr<std::unique_ptr<PendingSave>> BeginSave(const std::string& dir,
                                                       const std::vector<TensorSlice>& local,
                                                       const SaveOptions& options,
                                                       comm::ProcessGroup* group, bool background);

// One tensor of a checkpoint.
struct TensorInfo {
  std::string name;
  core::Shape shape;
  core::DType dtype = core::DType::kFloat32;
  int64_t numel() const { return core::NumElements(shape); }
};

// What ReadMetadata tells about a checkpoint, to plan loads.
struct CheckpointInfo {
  int format_version = 0;
  int world_size = 0;
  int64_t step = 0;
  std::map<std::string, std::string> user_metadata;
  // SaveOptions::records as saved.
  std::map<std::string, std::string> records;
  // In save order (rank 0's slices first).
  std::vector<TensorInfo> tensors;

  // The tensor named `name`, or nullptr.
  const TensorInfo* Find(const std::string& name) const;
};

// Reads, verifies (header and body checksums) and validates `<dir>/metadata.pb`.
// NotFound naming the directory when it has none; DataLoss naming the file (and the
// field) when it is damaged (any checksum mismatch, truncation), does not parse or
// contradicts itself (see internal::IndexMetadata: chunks that overlap, leave gaps or do
// not match their byte lengths, data file bytes outside every chunk, sizes whose
// arithmetic would overflow); FailedPrecondition naming the version for another format
// version (including version 1, which had no checksums).
absl::StatusOr<CheckpointInfo> ReadMetadata(const std::string& dir);

// Fill `destination` with elements [begin, end) of the flattened tensor `name`.
// `destination` is defined, has end - begin elements (any shape) on any device, and is
// fp32 or bf16 for a stored fp32 or bf16 tensor (converted, rounding to nearest even
// for fp32 -> bf16), int32 for int32.
struct LoadRequest {
  std::string name;
  int64_t begin = 0;
  int64_t end = 0;
  core::Tensor destination;
};

// What a Load read.
struct LoadStats {
  // Bytes read from data files (metadata.pb not counted): the checksum blocks
  // overlapping the requested ranges, and nothing else.
  int64_t bytes_read = 0;
  // Checksum blocks read and verified.
  int64_t blocks_verified = 0;
  // Distinct data files opened.
  int64_t files_opened = 0;
};

// Serves `requests` from the checkpoint `dir`, reading (pread) only the checksum blocks
// that overlap them and verifying each block's CRC32C before using it. Not collective:
// each rank loads what it needs. Errors (the destinations may be partly written):
// NotFound naming the tensor when the checkpoint lacks it (or the directory when it has
// no metadata); InvalidArgument naming the tensor and the sizes for a range outside the
// tensor, a destination of the wrong numel, an undefined one, or an impossible dtype
// conversion; DataLoss naming the data file and the tensor for a missing file, one whose
// size differs from the size the metadata records (truncated or extended: checked
// before any of it is read), and also the byte range for a checksum mismatch.
absl::StatusOr<LoadStats> Load(const std::string& dir, const std::vector<LoadRequest>& requests);

// Loads whole tensors, with their full shapes and stored dtypes, into fresh CPU memory
// counted under `tag`: those named in `names`, in that order, or every tensor in
// metadata order when `names` is empty. Errors as ReadMetadata and Load.
absl::StatusOr<std::vector<std::pair<std::string, core::Tensor>>> LoadFull(
    const std::string& dir, const std::vector<std::string>& names = {},
    core::MemoryTag tag = core::MemoryTag::kOther);

// Reads and verifies every byte of every data file of `dir` against its block
// checksums, and each file's size against the metadata: what Load of every tensor in
// full would check, without converting anything. Errors as ReadMetadata and Load.
absl::StatusOr<LoadStats> VerifyCheckpoint(const std::string& dir);

// Tidies what interrupted Saves left beside `dir`: deletes every `<dir>.tmp-*` and
// `<dir>.old-*` directory and returns how many it deleted. If `<dir>` itself is missing
// (a crash between the two renames of NOTE [Checkpoint commit]), the newest `.old-*`
// that ReadMetadata accepts is first renamed back to `<dir>` (and not counted). Save
// does the same itself; this is for tidying without saving. FailedPrecondition naming
// `<dir>.lock` while a Save to `dir` is running (NOTE [Save lock]); nothing is deleted
// then.
absl::StatusOr<int> CleanUpInterruptedSaves(const std::string& dir);

}  // namespace checkpoint

#endif  // CHECKPOINT_SHARDED_H_
