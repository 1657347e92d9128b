// Propagation macros for absl::Status and absl::StatusOr, and error context.
//
//   RETURN_IF_ERROR(group->Barrier());
//   ASSIGN_OR_RETURN(Tensor y, layer->Forward(x));
//   RETURN_IF_ERROR(core::Annotate(shard.CopyFrom(chunk), "FlatParameter"));
//
// Both macros return the failing status from the enclosing function unchanged;
// core::Annotate says where it failed without changing what failed.
#ifndef CORE_STATUS_MACROS_H_
#define CORE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace core {

// OK when `status` is OK. Otherwise a status with the same code, the message
// "<context>: <message>" and every payload of `status` (comm::MarkSecondary's among
// them, so an annotated secondary error stays secondary).
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace core

#define FSDP_STATUS_CONCAT_INNER_(a, b) a##b
#define FSDP_STATUS_CONCAT_(a, b) FSDP_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                    \
  do {                                           \
    ::absl::Status fsdp_status_ = (expr);        \
    if (!fsdp_status_.ok()) return fsdp_status_; \
  } while (0)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status, otherwise
// assigns the value to `lhs`, which may be a declaration.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  FSDP_ASSIGN_OR_RETURN_IMPL_(FSDP_STATUS_CONCAT_(fsdp_statusor_, __LINE__), lhs, rexpr)

#define FSDP_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                \
  if (!statusor.ok()) return statusor.status();           \
  lhs = std::move(statusor).value()

#endif  // CORE_STATUS_MACROS_H_
