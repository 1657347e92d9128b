#include "core/testing/tiny_ops.h"

#include <utility>

#include "core/status_macros.h"

namespace core {
namespace testing {

std::vector<std::string>* backward_log = nullptr;

void Log(const std::string& what) {
  if (backward_log != nullptr) backward_log->push_back(what);
}

namespace {
Tensor Like(const Tensor& t) { return Tensor::Zeros(t.shape()); }
}  // namespace

absl::StatusOr<Tensor> Mul(Arg a_arg, Arg b_arg, std::string name) {
  RETURN_IF_ERROR(a_arg.status());
  RETURN_IF_ERROR(b_arg.status());
  const Tensor a = a_arg.tensor();
  const Tensor b = b_arg.tensor();
  if (a.numel() != b.numel()) return absl::InvalidArgumentError(name + ": sizes differ");
  Tensor y = Like(a);
  for (int64_t i = 0; i < a.numel(); ++i)
    y.data<float>()[i] = a.data<float>()[i] * b.data<float>()[i];
  RETURN_IF_ERROR(
      RecordFunction(name, {a, b}, {&y}, {a, b},
                     [name](const BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
                       Log(name);
                       const Tensor& g = ctx.grad(0);
                       Tensor ga = Like(g), gb = Like(g);
                       for (int64_t i = 0; i < g.numel(); ++i) {
                         ga.data<float>()[i] = g.data<float>()[i] * ctx.saved(1).data<float>()[i];
                         gb.data<float>()[i] = g.data<float>()[i] * ctx.saved(0).data<float>()[i];
                       }
                       return std::vector<Tensor>{ga, gb};
                     },
                     {"a", "b"}));
  return y;
}

absl::StatusOr<Tensor> Add(Arg a_arg, Arg b_arg, std::string name) {
  RETURN_IF_ERROR(a_arg.status());
  RETURN_IF_ERROR(b_arg.status());
  const Tensor a = a_arg.tensor();
  const Tensor b = b_arg.tensor();
  Tensor y = Like(a);
  for (int64_t i = 0; i < a.numel(); ++i)
    y.data<float>()[i] = a.data<float>()[i] + b.data<float>()[i];
  RETURN_IF_ERROR(
      RecordFunction(name, {a, b}, {&y}, {},
                     [name](const BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
                       Log(name);
                       return std::vector<Tensor>{ctx.grad(0), ctx.grad(0)};
                     }));
  return y;
}

absl::StatusOr<Tensor> Sum(Arg a_arg) {
  RETURN_IF_ERROR(a_arg.status());
  const Tensor a = a_arg.tensor();
  Tensor y = Tensor::Zeros({});
  for (int64_t i = 0; i < a.numel(); ++i) y.data<float>()[0] += a.data<float>()[i];
  const Shape shape = a.shape();
  RETURN_IF_ERROR(
      RecordFunction("Sum", {a}, {&y}, {},
                     [shape](const BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
                       Log("Sum");
                       Tensor g = Tensor::Zeros(shape);
                       g.Fill(ctx.grad(0).data<float>()[0]);
                       return std::vector<Tensor>{g};
                     }));
  return y;
}

Tensor Vec(std::vector<float> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return Tensor::FromVector(v, {n}).value();
}

}  // namespace testing
}  // namespace core
