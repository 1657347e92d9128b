// How a parameter's elements are initialised, as data: ParamInit says, for element i of the
// row-major parameter, which value it gets from (seed, i) alone, so any slice of it can be
// filled without the rest (a rank's shard), and filling the whole gives the bits a layer's
// constructor always gave.
//
//   // In a layer's constructor (eager or deferred alike):
//   weight_ = AllocateParameter("weight", {out, in});
//   core::InitParameter(*weight_, core::ParamInit::Uniform(seed, /*skip=*/0, -b, b));
//   // Later, anywhere: elements [begin, begin + out.numel()) of that parameter.
//   RETURN_IF_ERROR(weight_->init->Fill(out, begin));
//
// NOTE [Deferred initialisation]: under a core::DeferredInitScope, Module::AllocateParameter
// registers a meta tensor (core::Tensor::Meta: shape and dtype, no storage) and
// InitParameter only records the recipe, so a model of any size is built in no memory.
// Its parameters cannot be used (a layer's Forward returns FailedPrecondition naming the
// parameter; optimizers refuse them) until something materializes them: fsdp::FullyShard
// allocates only each rank's shard of each unit and fills it with Fill at the shard's
// offsets (flatten::FlatParameter::Flatten), which gives, bit for bit and at any world
// size, the values a full construction on one rank gives. The stream behind a recipe is
// core::Rng(seed) advanced past `skip` elements of the same stream (a Linear's bias draws
// after its weight): uniform takes one NextU64 per element, normal two, so reaching
// element i costs (skip + i) draws and no arithmetic.
#ifndef CORE_PARAM_INIT_H_
#define CORE_PARAM_INIT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "core/tensor.h"

namespace core {

struct Parameter;

struct ParamInit {
  enum class Kind { kConstant, kUniform, kNormal };
  Kind kind = Kind::kConstant;
  uint64_t seed = 0;
  // Elements of the same stream drawn before this parameter's first.
  int64_t skip = 0;
  // kConstant: the value is `a`; kUniform: [a, b); kNormal: mean a, stddev b.
  float a = 0;
  float b = 0;

  static ParamInit Constant(float value);
  static ParamInit Uniform(uint64_t seed, int64_t skip, float lo, float hi);
  static ParamInit Normal(uint64_t seed, int64_t skip, float mean, float stddev);
  // U(-1/sqrt(fan_in), 1/sqrt(fan_in)) in float (torch.nn.Linear's default); the bound is 0
  // for fan_in < 1.
  static ParamInit FanIn(uint64_t seed, int64_t skip, int64_t fan_in);

  // Writes elements [begin, begin + out.numel()) of the parameter into `out`, a float32
  // CPU tensor. InvalidArgument for another dtype or device, a negative `begin`.
  absl::Status Fill(const Tensor& out, int64_t begin) const;

  // "uniform(seed=7, skip=0, [-0.125, 0.125))", for messages.
  std::string ToString() const;
};

// Records `init` as `p`'s recipe and, unless `p` is deferred (its data a meta tensor),
// fills its data with it. InvalidArgument when `p`'s data is materialized but not a
// float32 CPU tensor.
absl::Status InitParameter(Parameter& p, const ParamInit& init);

// Open on a thread while it lives: parameters that modules allocate on this thread are
// deferred (NOTE [Deferred initialisation]). Nestable.
//
//   std::shared_ptr<nn::Gpt> gpt;
//   {
//     core::DeferredInitScope deferred;
//     ASSIGN_OR_RETURN(gpt, nn::Gpt::Create(config));   // no parameter memory
//   }
//   ASSIGN_OR_RETURN(auto handle, fsdp::FullyShard(gpt, group, options, &registry));
class DeferredInitScope {
 public:
  DeferredInitScope();
  ~DeferredInitScope();
  DeferredInitScope(const DeferredInitScope&) = delete;
  DeferredInitScope& operator=(const DeferredInitScope&) = delete;

  // True while a scope is open on this thread.
  static bool Active();

 private:
  bool previous_;
};

}  // namespace core

#endif  // CORE_PARAM_INIT_H_
