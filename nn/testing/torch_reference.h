// Test-only: reads the PyTorch reference files of nn/torch_reference_test.cc,
// examples/seq2seq/seq2seq_torch_test.cc and examples/moe/moe_torch_test.cc, written by
// tools/torch_ref/reference.py, seq2seq_reference.py and moe_reference.py: safetensors files
// (NOTE [Safetensors layout] in checkpoint/safetensors.h) holding F64 tensors beside F32 and
// I32 ones, and string metadata. checkpoint::SafetensorsReader reads only the dtypes
// core::Tensor has (no F64) and sits above nn in the package order, hence this small reader.
// What those tests share is here too: the file's weights into a model's parameters, our
// loss and each parameter's gradient against the file's, and what the tests expect of them.
//
//   ASSIGN_OR_RETURN(nn::torch_ref::ReferenceFile f,
//                    nn::torch_ref::ReadReferenceFile("nn/testdata/torch_ref/gpt.safetensors"));
//   ASSIGN_OR_RETURN(int64_t vocab, f.Int("vocab_size"));   // build the model from these
//   ASSIGN_OR_RETURN(core::Tensor ids, f.Ints("ids"));
//   ASSIGN_OR_RETURN(nn::torch_ref::Comparison c,
//                    nn::torch_ref::RunAndCompare(f, model->NamedParameters(), [&] {
//                      ... forward, loss, backward ...
//                      return nn::torch_ref::Scalars{{"loss", loss}};
//                    }));
//   nn::torch_ref::ExpectMatches(c, /*scalar_rel=*/1e-6, /*grad_ratio=*/1e-5, "gpt");
#ifndef NN_TESTING_TORCH_REFERENCE_H_
#define NN_TESTING_TORCH_REFERENCE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/tensor.h"

namespace nn {
namespace torch_ref {

struct ReferenceTensor {
  std::string dtype;           // "F64", "F32" or "I32"
  core::Shape shape;           // [] for a scalar
  std::vector<double> values;  // row-major, each converted exactly to double
};

struct ReferenceFile {
  std::map<std::string, ReferenceTensor> tensors;
  std::map<std::string, std::string> metadata;

  // The tensor `name`, or NotFound naming it.
  absl::StatusOr<const ReferenceTensor*> Get(const std::string& name) const;
  // The metadata field `key`, or NotFound naming it.
  absl::StatusOr<std::string> Field(const std::string& key) const;
  // The metadata field `key` read as an integer or a double; NotFound as Field, or
  // InvalidArgument naming it when its text is not one.
  absl::StatusOr<int64_t> Int(const std::string& key) const;
  absl::StatusOr<double> Double(const std::string& key) const;
  // The I32 tensor `name` as an int32 core::Tensor of its shape; NotFound as Get, or
  // InvalidArgument naming it for another dtype.
  absl::StatusOr<core::Tensor> Ints(const std::string& name) const;
};

// Reads a whole file. NotFound when it does not exist; InvalidArgument naming the file for a
// malformed header, a dtype other than F64 / F32 / I32, or offsets outside the file.
absl::StatusOr<ReferenceFile> ReadReferenceFile(const std::string& path);

// Copies each "param.<name>" of `f` into the parameter of that name (fp32 on the CPU).
// InvalidArgument naming the first mismatch unless the file's weights and `params` are the
// same set of names, each weight F32 of its parameter's shape.
absl::Status LoadParameters(const ReferenceFile& f,
                            const std::vector<core::NamedParameter>& params);

// One parameter's gradient against the file's "grad.<name>".
struct GradientError {
  std::string name;
  double max_reference = 0;  // max |reference|
  double ratio = 0;          // max |ours - reference| / max |reference|
};

struct GradientComparison {
  std::vector<GradientError> params;  // in the order of the parameters given
  GradientError worst;                // the largest ratio (the last of equals)
};

// Each parameter's gradient (fp32 on the CPU) against the file's float64 one. InvalidArgument
// naming the parameter when its "grad.<name>" is missing or not F64, or its gradient is
// undefined or of another size.
absl::StatusOr<GradientComparison> CompareGradients(
    const ReferenceFile& f, const std::vector<core::NamedParameter>& params);

// One scalar of ours against the file's float64 scalar tensor of that name.
struct ScalarError {
  std::string name;  // the file's tensor: "loss", "aux", ...
  double ours = 0;
  double reference = 0;
  double relative = 0;  // |ours - reference| / |reference|
};

// Everything a reference test compares.
struct Comparison {
  std::vector<ScalarError> scalars;  // in the order the run gave them
  GradientComparison grads;
};

// Our values of some of the file's scalar tensors, by name, in the order to report them.
using Scalars = std::vector<std::pair<std::string, double>>;

// Loads the file's weights into `params` (LoadParameters), calls `run` (our forward, loss and
// backward on the model that owns them; it returns the scalars it computed, "loss" among
// them) and compares each of those scalars and each parameter's gradient (CompareGradients)
// with the file's. The first error of these steps; InvalidArgument naming a scalar the file
// does not hold as one F64 value.
absl::StatusOr<Comparison> RunAndCompare(const ReferenceFile& f,
                                         const std::vector<core::NamedParameter>& params,
                                         const std::function<absl::StatusOr<Scalars>()>& run);

// One line of figures: each scalar ("loss 4.3192739487 vs float64 4.3192737793: relative
// error 3.92e-08"), then the worst gradient ("worst of 85 gradients decoder1.norm3.weight:
// max |diff| / max |ref| = 1.18e-06"), separated by "; ".
std::string Summary(const Comparison& c);

// What each reference test expects of a Comparison: every scalar within `scalar_rel` of the
// file's, relative, and every gradient within `grad_ratio` (GradientError::ratio) of a
// reference gradient that is not all zeros; each failure of the running test names `label`.
// Prints "<label>: <Summary>" and records each scalar's relative error
// ("<name>_relative_error") and the worst gradient ratio ("worst_gradient_ratio") as
// properties of the running test.
void ExpectMatches(const Comparison& c, double scalar_rel, double grad_ratio,
                   const std::string& label);

}  // namespace torch_ref
}  // namespace nn

#endif  // NN_TESTING_TORCH_REFERENCE_H_
