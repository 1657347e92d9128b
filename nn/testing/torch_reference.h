// Test-only: reads the PyTorch reference files of nn/torch_reference_test.cc and
// examples/seq2seq/seq2seq_torch_test.cc, written by tools/torch_ref/reference.py and
// seq2seq_reference.py: safetensors files (NOTE [Safetensors layout] in
// checkpoint/safetensors.h) holding F64 tensors beside F32 and I32 ones, and string
// metadata. checkpoint::SafetensorsReader reads only the dtypes core::Tensor has (no F64)
// and sits above nn in the package order, hence this small reader.
//
//   ASSIGN_OR_RETURN(nn::torch_ref::ReferenceFile f,
//                    nn::torch_ref::ReadReferenceFile("nn/testdata/torch_ref/gpt.safetensors"));
//   ASSIGN_OR_RETURN(const nn::torch_ref::ReferenceTensor* loss, f.Get("loss"));
//   double l = loss->values[0];
#ifndef NN_TESTING_TORCH_REFERENCE_H_
#define NN_TESTING_TORCH_REFERENCE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace nn {
namespace torch_ref {

struct ReferenceTensor {
  std::string dtype;  // "F64", "F32" or "I32"
  core::Shape shape;  // [] for a scalar
  std::vector<double> values;  // row-major, each converted exactly to double
};

struct ReferenceFile {
  std::map<std::string, ReferenceTensor> tensors;
  std::map<std::string, std::string> metadata;

  // The tensor `name`, or NotFound naming it.
  absl::StatusOr<const ReferenceTensor*> Get(const std::string& name) const;
  // The metadata field `key`, or NotFound naming it.
  absl::StatusOr<std::string> Field(const std::string& key) const;
};

// Reads a whole file. NotFound when it does not exist; InvalidArgument naming the file for a
// malformed header, a dtype other than F64 / F32 / I32, or offsets outside the file.
absl::StatusOr<ReferenceFile> ReadReferenceFile(const std::string& path);

}  // namespace torch_ref
}  // namespace nn

#endif  // NN_TESTING_TORCH_REFERENCE_H_
