// Embedding: a lookup table of `num` rows of width `dim`, as torch.nn.Embedding.
//
//   auto wte = std::make_shared<nn::Embedding>(/*num=*/50257, /*dim=*/768, /*seed=*/1);
//   ASSIGN_OR_RETURN(core::Tensor h, wte->Forward(ids));   // int32 [B, T] -> [B, T, 768]
//   ASSIGN_OR_RETURN(core::Tensor none, wte->Backward(grad_h));  // adds into weight()->grad
//   // `none` is undefined: token ids have no gradient.
#ifndef NN_EMBEDDING_H_
#define NN_EMBEDDING_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/parameter.h"
#include "core/tensor.h"

namespace nn {

class Embedding : public core::Module {
 public:
  // Parameter "weight" [num, dim] drawn from N(0, 1) (PyTorch's init) in row-major order
  // from core::Rng(seed). A non-positive `num` or `dim` makes every Forward return
  // InvalidArgument naming it.
  Embedding(int64_t num_embeddings, int64_t embedding_dim, uint64_t seed = 0);

  std::string TypeName() const override { return "Embedding"; }

  // The table Parameter ([num, dim]).
  const core::ParameterPtr& weight() const { return weight_; }
  int64_t num_embeddings() const { return num_; }
  int64_t embedding_dim() const { return dim_; }
  // The seed the constructor initialised from.
  uint64_t seed() const { return seed_; }

 protected:
  // ids: int32 of any shape, each in [0, num) (InvalidArgument naming the first bad id
  // and its position otherwise) -> fp32 [..., dim] on the weight's device. The ids may
  // be on the CPU or on the weight's device (they are checked on the host: one copy back
  // from a device); the weight may be fp32 or bf16.
  absl::StatusOr<core::Tensor> ForwardImpl(const core::Tensor& ids) override;
  // grad_output [..., dim]: adds each row into the weight row of its id (repeated ids
  // accumulate); returns an undefined Tensor.
  absl::StatusOr<core::Tensor> BackwardImpl(const core::Tensor& grad_output) override;
  void ReleaseActivations() override { ids_ = core::Tensor(); }

 private:
  int64_t num_ = 0;
  int64_t dim_ = 0;
  uint64_t seed_ = 0;
  std::string config_error_;
  core::ParameterPtr weight_;
  core::Tensor ids_;  // cached by Forward, released by Backward
};

}  // namespace nn

#endif  // NN_EMBEDDING_H_
