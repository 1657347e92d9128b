// The whole fsdp/ package in one include: FullyShard and Release, the registry and
// handles, SummonFullParams, state dicts, NoSync and ClipGradNorm.
//
//   #include "fsdp/fsdp.h"
//   fsdp::WrapperRegistry registry;
//   ASSIGN_OR_RETURN(auto handle, fsdp::FullyShard(model, group, options, &registry));
//   ASSIGN_OR_RETURN(fsdp::StateDict full, fsdp::FullStateDict(*model, &registry));
//   RETURN_IF_ERROR(fsdp::Release(*model, &registry));
#ifndef FSDP_FSDP_H_
#define FSDP_FSDP_H_

#include "fsdp/fully_shard.h"
#include "fsdp/grad_utils.h"
#include "fsdp/handle.h"
#include "fsdp/options.h"
#include "fsdp/registry.h"
#include "fsdp/runtime.h"
#include "fsdp/state_dict.h"
#include "fsdp/summon.h"
#include "fsdp/unit.h"

#endif  // FSDP_FSDP_H_
