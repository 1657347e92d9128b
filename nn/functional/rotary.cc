#include "nn/functional/rotary.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/status_macros.h"
#include "kernels/cpu/rotary.h"
#include "nn/functional/internal/tensor_args.h"
#include "nn/internal/op_checks.h"
#include "nn/internal/op_costs.h"

#ifdef FSDP_WITH_CUDA
#include "kernels/cuda/rotary.h"
#endif

namespace nn {
namespace functional {
namespace {

using core::DType;
using core::Tensor;
using ::nn::internal::F32;
using ::nn::internal::MutF32;

namespace kcpu = ::kernels::cpu;
#ifdef FSDP_WITH_CUDA
namespace kc = ::kernels::cuda;
#endif

constexpr const char* kOp = "Rotary";

// Where each row's position comes from: positions (int32 [N, T], row n serving `per`
// consecutive blocks of T rows) or offset + t.
struct Positions {
  Tensor ids;
  int64_t per = 1;
  int64_t offset = 0;
};

// y = x turned (inverse: turned back) row by row; x and y [rows, D] of x's shape.
absl::Status RunRotary(const Tensor& x, const RotaryTables& tables, const Positions& p,
                       bool inverse, const Tensor& y) {
  if (x.numel() == 0) return absl::OkStatus();
  const int64_t D = x.size(-1), T = x.size(-2), rows = x.numel() / D;
  const int32_t* ids = p.ids.defined() ? p.ids.data<int32_t>() : nullptr;
  core::ProfiledOp op(core::OpCategory::kElementwise,
                      inverse ? "rotary.backward" : "rotary.forward", x.device(),
                      ::nn::internal::ElementwiseCost(x.numel(), 3, 3));
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), kOp, inverse ? "rotary backward" : "rotary forward",
               kc::RotaryRows(F32(x), F32(tables.cos), F32(tables.sin), tables.positions(), ids,
                              p.per, p.offset, MutF32(y), rows, T, D, inverse));
  }
  kcpu::RotaryRows(F32(x), F32(tables.cos), F32(tables.sin), tables.positions(), ids, p.per,
                   p.offset, MutF32(y), rows, T, D, inverse);
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Input(const core::Arg& arg) {
  RETURN_IF_ERROR(arg.status());
  const Tensor& x = arg.tensor();
  if (!x.defined()) return absl::InvalidArgumentError("Rotary: input is undefined");
  RETURN_IF_ERROR(internal::CheckFloat(kOp, "input", x));
  if (x.dim() < 2 || x.size(-1) % 2 != 0 || x.size(-1) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Rotary: input must be [..., T, D] with D even and positive, got ", x.ToString()));
  }
  return x;
}

// The tables fit x: D's head width, x's device, fp32 [P, D / 2] each.
absl::Status CheckTables(const Tensor& x, const RotaryTables& tables) {
  const int64_t half = x.size(-1) / 2;
  const bool shaped = tables.cos.defined() && tables.sin.defined() &&
                      tables.cos.dtype() == DType::kFloat32 &&
                      tables.sin.dtype() == DType::kFloat32 && tables.cos.dim() == 2 &&
                      tables.cos.shape() == tables.sin.shape() && tables.cos.size(1) == half;
  if (!shaped || tables.head_dim != x.size(-1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Rotary: tables must be nn::MakeRotaryTables' for head_dim ", x.size(-1), " of input ",
        x.ToString(), ", got head_dim ", tables.head_dim, " cos ",
        ::nn::internal::Describe(tables.cos), " sin ", ::nn::internal::Describe(tables.sin)));
  }
  RETURN_IF_ERROR(internal::CheckSameDevice(kOp, "input", x, "tables' cos", tables.cos));
  return internal::CheckSameDevice(kOp, "input", x, "tables' sin", tables.sin);
}

// The checks of `positions` for x [..., T, D] and tables of P positions.
absl::StatusOr<Positions> CheckPositions(const Tensor& x, const Tensor& ids, int64_t P) {
  const int64_t T = x.size(-2), blocks = T == 0 ? 0 : x.numel() / x.size(-1) / T;
  if (!ids.defined()) return absl::InvalidArgumentError("Rotary: positions is undefined");
  if (ids.dtype() != DType::kInt32) {
    return absl::InvalidArgumentError(
        absl::StrCat("Rotary: positions must be int32, got ", ids.ToString()));
  }
  RETURN_IF_ERROR(internal::CheckSameDevice(kOp, "input", x, "positions", ids));
  const int64_t rows = ids.dim() == 2 ? ids.size(0) : 1;
  if (ids.dim() < 1 || ids.dim() > 2 || ids.size(-1) != T || rows == 0 ||
      (blocks > 0 && blocks % rows != 0) || (blocks == 0 && rows != 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Rotary: positions must be [T] or [N, T] with N dividing the ", blocks,
                     " blocks of T of input ", x.ToString(), ", got ", ids.ToString()));
  }
  if (ids.device().is_cpu()) {
    const int32_t* v = ids.data<int32_t>();
    for (int64_t i = 0; i < ids.numel(); ++i) {
      if (v[i] < 0 || v[i] >= P) {
        return absl::InvalidArgumentError(absl::StrCat("Rotary: position ", v[i], " at index ", i,
                                                       " of positions ", ids.ToString(),
                                                       " is outside the tables' [0, ", P, ")"));
      }
    }
  }
  Positions p;
  p.ids = ids;
  p.per = blocks == 0 ? 1 : blocks / rows;
  return p;
}

// The rotation and its record: the backward turns the gradient back at the same
// positions (saved, when a tensor gives them) with the same tables (kept).
absl::StatusOr<Tensor> RotaryOp(const Tensor& x, const RotaryTables& tables, const Positions& p) {
  ASSIGN_OR_RETURN(Tensor y, internal::NewTensor(x.shape(), x.device()));
  RETURN_IF_ERROR(RunRotary(x, tables, p, /*inverse=*/false, y));
  const bool by_ids = p.ids.defined();
  std::vector<Tensor> saved;
  if (by_ids) saved.push_back(p.ids);
  Positions at = p;
  at.ids = Tensor();  // the saved copy is the one the backward reads
  RETURN_IF_ERROR(core::RecordFunction(
      kOp, {x}, {&y}, saved,
      [tables, at,
       by_ids](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        Positions back = at;
        if (by_ids) back.ids = ctx.saved(0);
        const Tensor& g = ctx.grad(0);
        ASSIGN_OR_RETURN(Tensor gx, internal::NewTensor(g.shape(), g.device()));
        RETURN_IF_ERROR(RunRotary(g, tables, back, /*inverse=*/true, gx));
        return std::vector<Tensor>{gx};
      },
      {"positions"}));
  return y;
}

}  // namespace

absl::StatusOr<Tensor> Rotary(core::Arg x_arg, const RotaryTables& tables, int64_t offset) {
  ASSIGN_OR_RETURN(const Tensor x, Input(x_arg));
  RETURN_IF_ERROR(CheckTables(x, tables));
  const int64_t T = x.size(-2);
  if (offset < 0 || offset + T > tables.positions()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Rotary: positions ", offset, " .. ", offset + T - 1, " of input ",
                     x.ToString(), " need offset >= 0 and tables of at least ", offset + T,
                     " positions, got ", tables.positions()));
  }
  Positions p;
  p.offset = offset;
  return RotaryOp(x, tables, p);
}

absl::StatusOr<Tensor> Rotary(core::Arg x_arg, const RotaryTables& tables, core::Arg positions) {
  ASSIGN_OR_RETURN(const Tensor x, Input(x_arg));
  RETURN_IF_ERROR(positions.status());
  RETURN_IF_ERROR(CheckTables(x, tables));
  ASSIGN_OR_RETURN(const Positions p, CheckPositions(x, positions.tensor(), tables.positions()));
  return RotaryOp(x, tables, p);
}

absl::StatusOr<Tensor> Rotary(core::Arg x_arg, int64_t offset, double theta) {
  ASSIGN_OR_RETURN(const Tensor x, Input(x_arg));
  const int64_t T = x.size(-2);
  if (offset < 0 || !std::isfinite(theta) || theta <= 0.0) {
    return absl::InvalidArgumentError(absl::StrCat("Rotary: offset must be >= 0 (got ", offset,
                                                   ") and theta finite and > 0 (got ", theta, ")"));
  }
  if (offset + T == 0) {  // no positions to turn: an empty x
    return RotaryOp(x, RotaryTables{}, Positions{});
  }
  absl::StatusOr<RotaryTables> tables = MakeRotaryTables(offset + T, x.size(-1), theta, x.device());
  if (!tables.ok()) return core::Annotate(tables.status(), "Rotary");
  return Rotary(x, *tables, offset);
}

}  // namespace functional
}  // namespace nn
