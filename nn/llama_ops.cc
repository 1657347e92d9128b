// The Llama layers' ops of nn/tensor_ops.h: silu(a) * b and the rotary packing of grouped
// q, k, v (RMSNorm's run LayerNorm's code, in nn/tensor_ops_norm.cc). Each checks its tensors,
// records its op and calls the CPU launcher (kernels/cpu/kernels.h) or the CUDA one
// (kernels/cuda/kernels.h), as tensor_ops*.cc do.
#include <cstdint>
#include <initializer_list>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cpu/kernels.h"
#include "nn/internal/op_checks.h"
#include "nn/internal/op_costs.h"
#include "nn/tensor_ops.h"

#ifdef FSDP_WITH_CUDA
#include "kernels/cuda/kernels.h"
#endif

namespace nn {
namespace {

namespace kcpu = ::kernels::cpu;
using core::DType;
using core::OpCategory;
using core::ProfiledOp;
using core::Tensor;
using internal::Arg;
using internal::CheckDevices;
using internal::CheckDistinct;
using internal::CheckDType;
using internal::CheckElementwiseF32;
using internal::CheckFp32OrBf16;
using internal::CheckNumel;
using internal::F32;
using internal::IsBf16;
using internal::MutF32;
#ifdef FSDP_WITH_CUDA
namespace kc = ::kernels::cuda;
#endif

// InvalidArgument unless every output starts at another address than every other entry of
// `args` (internal::CheckDistinct), also where a caller passed one tensor for both. An output
// may be listed in `args` too, under its own name: that entry is not compared with it.
absl::Status CheckOutputsDistinct(absl::string_view what, std::initializer_list<Arg> outputs,
                                  std::initializer_list<Arg> args) {
  for (const Arg& out : outputs) {
    for (const Arg& other : args) {
      if (absl::string_view(out.name) == other.name) continue;
      RETURN_IF_ERROR(CheckDistinct(what, out.name, *out.tensor, other.name, *other.tensor));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SiluMulForward(absl::string_view what, const Tensor& a, const Tensor& b,
                            const Tensor& h) {
  RETURN_IF_ERROR(CheckDevices(what, {{"gate", &a}, {"up", &b}, {"output", &h}}));
  RETURN_IF_ERROR(CheckElementwiseF32(what, {{"gate", &a}, {"up", &b}}));
  // NOTE [GEMM epilogues]: a bf16 output is a bf16 GEMM's operand, stored so directly.
  RETURN_IF_ERROR(CheckFp32OrBf16(what, "output", h));
  RETURN_IF_ERROR(CheckNumel(what, "output", h, a.numel()));
  RETURN_IF_ERROR(CheckOutputsDistinct(what, {{"output", &h}}, {{"gate", &a}, {"up", &b}}));
  const int64_t n = a.numel();
  ProfiledOp op(OpCategory::kElementwise, "silu_mul.forward", a.device(),
                internal::SiluMulForwardCost(n, core::DTypeSize(h.dtype())));
  if (a.device().is_cuda()) {
    NN_ON_CUDA(a.device(), what, "silu(gate) * up",
               kc::SiluMulForward(F32(a), F32(b), h.raw_data(), n, IsBf16(h)));
  }
  kcpu::SiluMulForward(F32(a), F32(b), h.raw_data(), n, IsBf16(h));
  return absl::OkStatus();
}

absl::Status SiluMulBackward(absl::string_view what, const Tensor& a, const Tensor& b,
                             const Tensor& gh, const Tensor& ga, const Tensor& gb) {
  RETURN_IF_ERROR(CheckDevices(what, {{"gate", &a},
                                      {"up", &b},
                                      {"grad_output", &gh},
                                      {"gate gradient", &ga},
                                      {"up gradient", &gb}}));
  RETURN_IF_ERROR(CheckElementwiseF32(what, {{"gate", &a}, {"up", &b}, {"grad_output", &gh}}));
  for (const Arg& g : {Arg{"gate gradient", &ga}, Arg{"up gradient", &gb}}) {
    RETURN_IF_ERROR(CheckFp32OrBf16(what, g.name, *g.tensor));
    RETURN_IF_ERROR(CheckNumel(what, g.name, *g.tensor, a.numel()));
  }
  RETURN_IF_ERROR(CheckOutputsDistinct(what, {{"gate gradient", &ga}, {"up gradient", &gb}},
                                       {{"gate", &a},
                                        {"up", &b},
                                        {"grad_output", &gh},
                                        {"gate gradient", &ga},
                                        {"up gradient", &gb}}));
  const int64_t n = a.numel();
  ProfiledOp op(
      OpCategory::kElementwise, "silu_mul.backward", a.device(),
      internal::SiluMulBackwardCost(n, core::DTypeSize(ga.dtype()), core::DTypeSize(gb.dtype())));
  if (a.device().is_cuda()) {
    NN_ON_CUDA(a.device(), what, "silu(gate) * up backward",
               kc::SiluMulBackward(F32(a), F32(b), F32(gh), ga.raw_data(), gb.raw_data(), n,
                                   IsBf16(ga), IsBf16(gb)));
  }
  kcpu::SiluMulBackward(F32(a), F32(b), F32(gh), ga.raw_data(), gb.raw_data(), n, IsBf16(ga),
                        IsBf16(gb));
  return absl::OkStatus();
}

namespace {

// The sizes of the rotary packing, checked.
struct PackDims {
  int64_t rows = 0, T = 0, H = 0, KV = 0, D = 0;
};

// q [B, T, C] (C = H * D, D even), k and v [B, T, KV * D], cos and sin [>= T, D / 2]
// (any shape of that many elements), qkv [B, T, 3C]; all on one device, fp32 but for the
// outputs (qkv when packed_is_output, else q, k and v), which may also be bf16 (NOTE [GEMM
// epilogues]). `q` and `k` name the q and k shaped tensors in messages.
absl::StatusOr<PackDims> CheckPack(absl::string_view what, const char* q_name, const Tensor& q,
                                   const char* k_name, const Tensor& k, const char* v_name,
                                   const Tensor& v, const Tensor& cos, const Tensor& sin,
                                   int64_t n_head, int64_t n_kv_head, const char* qkv_name,
                                   const Tensor& qkv, bool packed_is_output) {
  RETURN_IF_ERROR(CheckDevices(
      what,
      {{q_name, &q}, {k_name, &k}, {v_name, &v}, {"cos", &cos}, {"sin", &sin}, {qkv_name, &qkv}}));
  for (const auto& [a, output] :
       {std::make_pair(Arg{q_name, &q}, !packed_is_output),
        std::make_pair(Arg{k_name, &k}, !packed_is_output),
        std::make_pair(Arg{v_name, &v}, !packed_is_output), std::make_pair(Arg{"cos", &cos}, false),
        std::make_pair(Arg{"sin", &sin}, false),
        std::make_pair(Arg{qkv_name, &qkv}, packed_is_output)}) {
    RETURN_IF_ERROR(output ? CheckFp32OrBf16(what, a.name, *a.tensor)
                           : CheckDType(what, a.name, *a.tensor, DType::kFloat32));
  }
  if (n_head <= 0 || n_kv_head <= 0 || n_head % n_kv_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": n_head (", n_head,
                                                   ") must be a positive multiple of n_kv_head (",
                                                   n_kv_head, ")"));
  }
  if (q.dim() != 3 || q.size(2) % n_head != 0 || (q.size(2) / n_head) % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", q_name, " must be [B, T, n_head * D] with D even (n_head ", n_head,
                     "), got ", q.ToString()));
  }
  PackDims d;
  d.T = q.size(1);
  d.rows = q.size(0) * d.T;
  d.H = n_head;
  d.KV = n_kv_head;
  d.D = q.size(2) / n_head;
  const core::Shape kv_shape = {q.size(0), d.T, d.KV * d.D};
  const core::Shape qkv_shape = {q.size(0), d.T, 3 * d.H * d.D};
  for (const auto& [name, t, shape] :
       {std::make_tuple(k_name, &k, kv_shape), std::make_tuple(v_name, &v, kv_shape),
        std::make_tuple(qkv_name, &qkv, qkv_shape)}) {
    if (t->shape() != shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": ", name, " must be ", core::ShapeToString(shape), ", got ", t->ToString()));
    }
  }
  const int64_t half = d.D / 2;
  for (const Arg& a : {Arg{"cos", &cos}, Arg{"sin", &sin}}) {
    if (a.tensor->numel() % half != 0 || a.tensor->numel() / half < d.T) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", a.name, " ", a.tensor->ToString(),
                                                     " must hold at least ", d.T, " rows of ",
                                                     half));
    }
  }
  return d;
}

}  // namespace

absl::Status RotaryPackQkv(absl::string_view what, const Tensor& q, const Tensor& k,
                           const Tensor& v, const Tensor& cos, const Tensor& sin, int64_t n_head,
                           int64_t n_kv_head, const Tensor& qkv) {
  ASSIGN_OR_RETURN(const PackDims d,
                   CheckPack(what, "q", q, "k", k, "v", v, cos, sin, n_head, n_kv_head,
                             "q, k and v", qkv, /*packed_is_output=*/true));
  RETURN_IF_ERROR(
      CheckOutputsDistinct(what, {{"q, k and v", &qkv}}, {{"q", &q}, {"k", &k}, {"v", &v}}));
  ProfiledOp op(
      OpCategory::kElementwise, "rotary_pack.forward", q.device(),
      internal::RotaryPackCost(d.rows, d.H * d.D, d.KV * d.D, core::DTypeSize(qkv.dtype())));
  if (q.device().is_cuda()) {
    NN_ON_CUDA(q.device(), what, "rotary packing of q, k, v",
               kc::RotaryPackQkv(F32(q), F32(k), F32(v), F32(cos), F32(sin), qkv.raw_data(), d.rows,
                                 d.T, d.H, d.KV, d.D, IsBf16(qkv)));
  }
  kcpu::RotaryPackQkv(F32(q), F32(k), F32(v), F32(cos), F32(sin), qkv.raw_data(), d.rows, d.T, d.H,
                      d.KV, d.D, IsBf16(qkv));
  return absl::OkStatus();
}

absl::Status RotaryPackQkvBackward(absl::string_view what, const Tensor& gqkv, const Tensor& cos,
                                   const Tensor& sin, int64_t n_head, int64_t n_kv_head,
                                   const Tensor& gq, const Tensor& gk, const Tensor& gv) {
  ASSIGN_OR_RETURN(const PackDims d,
                   CheckPack(what, "q gradient", gq, "k gradient", gk, "v gradient", gv, cos, sin,
                             n_head, n_kv_head, "q, k and v gradient", gqkv,
                             /*packed_is_output=*/false));
  RETURN_IF_ERROR(
      CheckOutputsDistinct(what, {{"q gradient", &gq}, {"k gradient", &gk}, {"v gradient", &gv}},
                           {{"q gradient", &gq},
                            {"k gradient", &gk},
                            {"v gradient", &gv},
                            {"q, k and v gradient", &gqkv}}));
  ProfiledOp op(
      OpCategory::kElementwise, "rotary_pack.backward", gqkv.device(),
      internal::RotaryPackBackwardCost(d.rows, d.H * d.D, d.KV * d.D, core::DTypeSize(gq.dtype()),
                                       core::DTypeSize(gk.dtype()), core::DTypeSize(gv.dtype())));
  if (gqkv.device().is_cuda()) {
    NN_ON_CUDA(gqkv.device(), what, "rotary packing backward",
               kc::RotaryPackQkvBackward(F32(gqkv), F32(cos), F32(sin), gq.raw_data(),
                                         gk.raw_data(), gv.raw_data(), d.rows, d.T, d.H, d.KV, d.D,
                                         IsBf16(gq), IsBf16(gk), IsBf16(gv)));
  }
  kcpu::RotaryPackQkvBackward(F32(gqkv), F32(cos), F32(sin), gq.raw_data(), gk.raw_data(),
                              gv.raw_data(), d.rows, d.T, d.H, d.KV, d.D, IsBf16(gq), IsBf16(gk),
                              IsBf16(gv));
  return absl::OkStatus();
}

}  // namespace nn
