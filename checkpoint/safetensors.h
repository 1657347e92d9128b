// Safetensors export and import: the single-file format of Hugging Face's
// `safetensors` library, which PyTorch (safetensors.torch.load_file) and the Hugging
// Face tools read, for a full (unsharded) model.
//
//   RETURN_IF_ERROR(checkpoint::ExportSafetensors("/out/model.safetensors", *model,
//                                                 {{"format", "pt"}}));
//   ASSIGN_OR_RETURN(checkpoint::SafetensorsFile file,
//                    checkpoint::ImportSafetensors("/out/model.safetensors"));
//   // or, from bytes already in memory: checkpoint::ParseSafetensors(bytes)
//   for (const auto& [name, tensor] : file.tensors) ...   // names as in NamedParameters()
//
// NOTE [Safetensors layout], as published (github.com/huggingface/safetensors):
// - 8 bytes: N, the header length, an unsigned 64-bit little-endian integer;
// - N bytes: a UTF-8 JSON object {"<name>": {"dtype": "F32", "shape": [2, 3],
//   "data_offsets": [begin, end]}, ...}, optionally with "__metadata__": {string: string};
//   offsets count from the first byte after the header; the writer pads the header
//   with spaces (0x20) so that 8 + N is a multiple of 8;
// - the byte buffer: every tensor's elements, row-major, little-endian, back to back
//   with no gaps, so the offsets tile [0, buffer size) exactly.
// Element types here: "F32", "BF16", "I32" (core::DType); import also reads "F16", widened
// exactly to F32 (many published checkpoints are float16). Export writes tensors in the
// order given, the header JSON compact, "__metadata__" first when there is any, as the
// reference implementation does.
#ifndef CHECKPOINT_SAFETENSORS_H_
#define CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/allocator.h"
#include "core/dtype.h"
#include "core/module.h"
#include "core/tensor.h"

namespace checkpoint {

using NamedTensors = std::vector<std::pair<std::string, core::Tensor>>;

// Largest header N accepted on import, the reference implementation's limit (100 MB).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100000000;

// "F32", "BF16", "I32".
std::string SafetensorsDTypeName(core::DType dtype);

// Inverse of SafetensorsDTypeName. Unimplemented for the other dtypes the format
// defines ("F16", "F64", "I64", "U8", "BOOL", ...; the readers below take F16 nonetheless,
// widened to F32), InvalidArgument for any other string.
absl::StatusOr<core::DType> ParseSafetensorsDType(absl::string_view name);

// Writes `tensors` (each defined, any device; names unique, non-empty, valid UTF-8 and
// not "__metadata__") and `metadata` to `path` in the safetensors format, through a
// temporary file beside it that is fsynced and renamed into place, so `path` is never
// half-written. InvalidArgument naming the tensor for a bad name or tensor; I/O errors
// name the file.
absl::Status ExportSafetensors(const std::string& path, const NamedTensors& tensors,
                               const std::map<std::string, std::string>& metadata = {});

// Every parameter's shape, by NamedParameters() name: take it before sharding and pass
// it to the Module export below to have it checked.
std::map<std::string, core::Shape> ParameterShapes(const core::Module& module);

// Exports module.NamedParameters() (tied parameters once, under their first name).
// FailedPrecondition naming the parameter (and module.Describe()) when a parameter's
// data is undefined, or, if `full_shapes` is non-empty, when a parameter is missing from
// it or its data does not have that shape (it is sharded: gather it first). Core's
// Parameter does not record a full shape, so without `full_shapes` a sharded 1-D slice
// cannot be told from a genuine 1-D parameter.
absl::Status ExportSafetensors(const std::string& path, const core::Module& module,
                               const std::map<std::string, std::string>& metadata = {},
                               const std::map<std::string, core::Shape>& full_shapes = {});

// What a safetensors file holds.
struct SafetensorsFile {
  // In data-offset order (the order they were written).
  NamedTensors tensors;
  // Each tensor's dtype as the file stores it, in the same order: SafetensorsDTypeName of its
  // dtype, or "F16" for one read widened to F32.
  std::vector<std::string> stored_dtypes;
  std::map<std::string, std::string> metadata;

  // The tensor named `name`, or nullptr.
  const core::Tensor* Find(const std::string& name) const;
};

// Reads a safetensors file into fresh CPU tensors counted under `tag`, validating the
// whole layout first. Errors name the file, and the tensor where there is one:
// InvalidArgument for a header length beyond kMaxSafetensorsHeaderBytes or the file, a
// header that is not a JSON object (with the parser's message), duplicate names,
// malformed entries, an unknown dtype, negative or overlapping offsets, gaps between
// tensors, a byte length that is not numel x dtype size, or bytes after the last
// tensor; Unimplemented for a dtype this library neither has nor widens (F64, I64, U8,
// ...; F16 is read as F32, each value exact); DataLoss
// when the file is shorter than its header says; NotFound when it does not exist.
absl::StatusOr<SafetensorsFile> ImportSafetensors(const std::string& path,
                                                  core::MemoryTag tag = core::MemoryTag::kOther);

struct SafetensorsLayout;
namespace internal {
class FileReader;
}  // namespace internal

// A safetensors file opened to read its tensors one at a time, so that a caller never
// holds more than the tensor it reads (a rank loading its shards of a large checkpoint).
// Open validates the whole layout as ImportSafetensors does; nothing else is read until
// Read. Errors as ImportSafetensors's, naming the file (and tensor); Read and ShapeOf of
// a name the file lacks are NotFound.
class SafetensorsReader {
 public:
  static absl::StatusOr<SafetensorsReader> Open(const std::string& path);
  SafetensorsReader(SafetensorsReader&&) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&&) noexcept;
  ~SafetensorsReader();

  // In data-offset order.
  std::vector<std::string> Names() const;
  const std::map<std::string, std::string>& metadata() const;
  absl::StatusOr<core::Shape> ShapeOf(const std::string& name) const;
  // The tensor `name` in fresh CPU memory counted under `tag`.
  absl::StatusOr<core::Tensor> Read(const std::string& name,
                                    core::MemoryTag tag = core::MemoryTag::kOther) const;

 private:
  SafetensorsReader();
  std::unique_ptr<internal::FileReader> file_;
  std::unique_ptr<SafetensorsLayout> layout_;
  std::string where_;
};

// ImportSafetensors of a whole file held in memory: the same checks, errors and result,
// with `name` standing for the file in messages. Never reads outside `bytes`.
absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view bytes,
                                                 const std::string& name = "<memory>",
                                                 core::MemoryTag tag = core::MemoryTag::kOther);

// Copies the tensors of a safetensors file into module.NamedParameters() by name,
// converting fp32 <-> bf16 if the dtypes differ. NotFound naming the parameter and the
// file for a parameter the file lacks; InvalidArgument for a shape mismatch, an
// impossible conversion, or (when `strict`) a tensor in the file no parameter has.
// Checks everything before it changes any parameter.
absl::Status ImportSafetensorsInto(const std::string& path, core::Module& module,
                                   bool strict = true);

}  // namespace checkpoint

#endif  // CHECKPOINT_SAFETENSORS_H_
