#include "core/param_init.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/parameter.h"
#include "core/random.h"

namespace core {
namespace {

thread_local bool deferred_init = false;

}  // namespace

ParamInit ParamInit::Constant(float value) {
  ParamInit init;
  init.kind = Kind::kConstant;
  init.a = value;
  return init;
}

ParamInit ParamInit::Uniform(uint64_t seed, int64_t skip, float lo, float hi) {
  return ParamInit{Kind::kUniform, seed, skip, lo, hi};
}

ParamInit ParamInit::FanIn(uint64_t seed, int64_t skip, int64_t fan_in) {
  const float bound = fan_in > 0 ? 1.0f / std::sqrt(static_cast<float>(fan_in)) : 0.0f;
  return Uniform(seed, skip, -bound, bound);
}

ParamInit ParamInit::Normal(uint64_t seed, int64_t skip, float mean, float stddev) {
  return ParamInit{Kind::kNormal, seed, skip, mean, stddev};
}

absl::Status ParamInit::Fill(const Tensor& out, int64_t begin) const {
  if (!out.defined() || out.dtype() != DType::kFloat32 || !out.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat("ParamInit::Fill (", ToString(),
                                                   "): needs a "
                                                   "float32 CPU tensor, got ",
                                                   out.ToString()));
  }
  if (begin < 0 || skip < 0) {
    return absl::InvalidArgumentError(absl::StrCat("ParamInit::Fill (", ToString(), "): begin ",
                                                   begin, " and skip must be >= 0"));
  }
  float* p = out.data<float>();
  const int64_t n = out.numel();
  if (kind == Kind::kConstant) {
    for (int64_t i = 0; i < n; ++i) p[i] = a;
    return absl::OkStatus();
  }
  // The same draws, in the same order, as filling the whole stream from its start.
  Rng rng(seed);
  const int64_t draws = kind == Kind::kUniform ? 1 : 2;
  rng.Discard((skip + begin) * draws);
  if (kind == Kind::kUniform) {
    for (int64_t i = 0; i < n; ++i) p[i] = rng.Uniform(a, b);
  } else {
    for (int64_t i = 0; i < n; ++i) p[i] = rng.Normal(a, b);
  }
  return absl::OkStatus();
}

std::string ParamInit::ToString() const {
  switch (kind) {
    case Kind::kConstant:
      return absl::StrCat("constant(", a, ")");
    case Kind::kUniform:
      return absl::StrCat("uniform(seed=", seed, ", skip=", skip, ", [", a, ", ", b, "))");
    case Kind::kNormal:
      return absl::StrCat("normal(seed=", seed, ", skip=", skip, ", mean=", a, ", stddev=", b, ")");
  }
  return "unknown";
}

absl::Status InitParameter(Parameter& p, const ParamInit& init) {
  p.init = std::make_shared<const ParamInit>(init);
  if (p.data.is_meta()) return absl::OkStatus();
  return init.Fill(p.data, 0);
}

DeferredInitScope::DeferredInitScope() : previous_(deferred_init) { deferred_init = true; }
DeferredInitScope::~DeferredInitScope() { deferred_init = previous_; }
bool DeferredInitScope::Active() { return deferred_init; }

}  // namespace core
