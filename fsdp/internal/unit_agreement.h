// Cross-rank agreement for fsdp operations on a wrapped subtree (state dict loads,
// SummonFullParams, Release, ClipGradNorm): their checks run on each rank alone, so
// before the first collective or write every rank learns whether any rank failed
// (NOTE [Agree before acting] below).
//
//   absl::Status local = ValidateMyPart(...);   // may fail on rank 1 only
//   RETURN_IF_ERROR(fsdp::internal::AgreeAcrossUnitGroups(*model, &registry, local,
//                                                         "LoadFullStateDict(<root> (Gpt))"));
//   // every rank: OK, or "rank 1: <its error>" with its code
//
// NOTE [Agree before acting]: an fsdp operation whose checks fail on some ranks only
// must not let the other ranks go on: they would block in the operation's (or the
// next) collective until a peer closes or the timeout expires, or train on different
// weights. So such operations agree on the outcome of their checks (comm::AgreeOnStatus)
// over the group of every unit of the subtree before communicating or writing. A module
// without units has no group, is plain on every rank, and agrees with no one.
#ifndef FSDP_INTERNAL_UNIT_AGREEMENT_H_
#define FSDP_INTERNAL_UNIT_AGREEMENT_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/module.h"
#include "fsdp/registry.h"

namespace fsdp {
namespace internal {

// Agrees on `local` over the group (UnitGroups::world) of every unit rooted in
// `module`'s subtree, each distinct group once, in NamedModules() order, with the first
// unit's FullyShardOptions::timeout: returns OK when every rank's `local` is OK,
// otherwise the lowest failing rank's error on every rank ("rank r: ...", same code;
// comm::AgreeOnStatus). Returns `local` unchanged when the subtree holds no unit or
// `registry` is null. A collective over those groups when there are any.
absl::Status AgreeAcrossUnitGroups(core::Module& module, WrapperRegistry* registry,
                                   const absl::Status& local, absl::string_view what);

}  // namespace internal
}  // namespace fsdp

#endif  // FSDP_INTERNAL_UNIT_AGREEMENT_H_
