// Sequential: a graph module (NOTE [Graph modules] in core/module.h) that calls its children
// in order, each on the previous one's outputs, as torch.nn.Sequential. Children are
// registered as "0", "1", ..., so parameter names read "0.weight", "1.bias".
//
//   auto model = nn::Sequential::Make({std::make_shared<nn::Linear>(5, 8),
//                                      std::make_shared<nn::ReLU>(),
//                                      std::make_shared<nn::Linear>(8, 5)});
//   ASSIGN_OR_RETURN(core::Tensor y, model->CallOne({x}));       // on the graph, or
//   ASSIGN_OR_RETURN(core::Tensor y, model->Forward(x));         // one tensor in and out
//   ASSIGN_OR_RETURN(core::Tensor gx, model->Backward(gy));
#ifndef NN_SEQUENTIAL_H_
#define NN_SEQUENTIAL_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/tensor.h"

namespace nn {

class Sequential : public core::Module {
 public:
  // Registers `modules` as children "0", "1", ... in order. A null entry is not
  // registered and makes every Forward return InvalidArgument naming its index. An
  // empty Sequential is the identity.
  static std::shared_ptr<Sequential> Make(std::vector<std::shared_ptr<core::Module>> modules);

  std::string TypeName() const override { return "Sequential"; }

  // The children in order (the objects passed to Make).
  const std::vector<std::shared_ptr<core::Module>>& modules() const { return modules_; }
  size_t size() const { return modules_.size(); }
  // Child `i` (i < size()).
  const std::shared_ptr<core::Module>& operator[](size_t i) const { return modules_[i]; }

 protected:
  // Each child's Call on the previous one's outputs; the first error is returned.
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& inputs) override;

 private:
  explicit Sequential(std::vector<std::shared_ptr<core::Module>> modules);

  std::vector<std::shared_ptr<core::Module>> modules_;
  std::string config_error_;
};

}  // namespace nn

#endif  // NN_SEQUENTIAL_H_
