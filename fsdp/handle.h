// FullyShardHandle: what FullyShard returns for the module it wrapped: that module, the
// group and options of the wrap, and the units it manages (its own and those of
// submodules wrapped before it). The module itself stays the object users call;
// the handle only describes and controls the wrap.
//
//   ASSIGN_OR_RETURN(std::shared_ptr<fsdp::FullyShardHandle> handle,
//                    fsdp::FullyShard(model, group, options, &registry));
//   for (const auto& unit : handle->units()) LOG(INFO) << unit->label();
//   RETURN_IF_ERROR(handle->Reshard());   // after an evaluation forward under SHARD_GRAD_OP
#ifndef FSDP_HANDLE_H_
#define FSDP_HANDLE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "comm/process_group.h"
#include "core/module.h"
#include "fsdp/options.h"
#include "fsdp/runtime.h"
#include "fsdp/unit.h"

namespace fsdp {

class FullyShardHandle {
 public:
  // `units` in the order of the wrap plan (children before parents, the root last).
  FullyShardHandle(const std::shared_ptr<core::Module>& module,
                   std::shared_ptr<comm::ProcessGroup> group, FullyShardOptions options,
                   std::vector<std::shared_ptr<Unit>> units, std::shared_ptr<Runtime> runtime);

  // The wrapped module, or null once it is destroyed.
  std::shared_ptr<core::Module> module() const { return module_.lock(); }
  // The module's Describe() at wrap time.
  const std::string& label() const { return label_; }
  const std::shared_ptr<comm::ProcessGroup>& group() const { return group_; }
  const FullyShardOptions& options() const { return options_; }
  // The units that still exist and are not released, in plan order.
  std::vector<std::shared_ptr<Unit>> units() const;
  // The unit rooted at the wrapped module, or null once released.
  std::shared_ptr<Unit> root_unit() const;
  // True once every unit of the wrap was released (or destroyed).
  bool released() const { return units().empty(); }

  // Reshards every unit left unsharded outside forward/backward (SHARD_GRAD_OP and
  // NO_SHARD keep units unsharded after a forward until the backward ends; after an
  // evaluation forward this restores the sharded steady state). FailedPrecondition
  // while a forward or backward is in progress.
  absl::Status Reshard();

 private:
  std::weak_ptr<core::Module> module_;
  std::string label_;
  std::shared_ptr<comm::ProcessGroup> group_;
  FullyShardOptions options_;
  std::vector<std::weak_ptr<Unit>> units_;
  std::weak_ptr<Runtime> runtime_;
};

}  // namespace fsdp

#endif  // FSDP_HANDLE_H_
