#include "fsdp/runtime.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace fsdp {
namespace {

// Locks `weak` or returns FailedPrecondition (a hook outliving its unit).
absl::StatusOr<std::shared_ptr<Unit>> Lock(const std::weak_ptr<Unit>& weak) {
  std::shared_ptr<Unit> unit = weak.lock();
  if (unit == nullptr) {
    return absl::FailedPreconditionError("fsdp hook fired for a unit that no longer exists");
  }
  return unit;
}

absl::Status CheckNotSummoned(const Unit& unit, const char* what) {
  if (unit.summoned()) {
    return absl::FailedPreconditionError(absl::StrCat("fsdp unit ", unit.label(), ": ", what,
                                                      " inside SummonFullParams; close it first"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Runtime::Attach(const std::shared_ptr<Unit>& unit) {
  std::shared_ptr<core::Module> module = unit->module();
  if (module == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("fsdp unit ", unit->label(), ": its module no longer exists"));
  }
  std::weak_ptr<Unit> weak_unit = unit;
  std::weak_ptr<Runtime> weak_self = shared_from_this();
  auto call = [weak_unit, weak_self](
                  absl::Status (Runtime::*method)(const std::shared_ptr<Unit>&)) -> absl::Status {
    ASSIGN_OR_RETURN(std::shared_ptr<Unit> u, Lock(weak_unit));
    std::shared_ptr<Runtime> self = weak_self.lock();
    if (self == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("fsdp unit ", u->label(), ": its registry no longer exists"));
    }
    return ((*self).*method)(u);
  };
  std::vector<core::HookHandle> hooks;
  // NOTE [Recompute] in runtime.h: the forward hooks also run in a recompute.
  const core::HookOptions in_recompute{.run_in_recompute = true};
  hooks.push_back(module->RegisterForwardPreHook(
      [call](core::Module&, core::Tensors&) { return call(&Runtime::ForwardPre); }, in_recompute));
  hooks.push_back(module->RegisterForwardPostHook(
      [call](core::Module&, const core::Tensors&, core::Tensors&) {
        return call(&Runtime::ForwardPost);
      },
      in_recompute));
  hooks.push_back(module->RegisterBackwardPreHook(
      [call](core::Module&) { return call(&Runtime::BackwardPre); }));
  hooks.push_back(module->RegisterBackwardPostHook(
      [call](core::Module&) { return call(&Runtime::BackwardPost); }));
  unit->set_hooks(std::move(hooks));
  attached_.erase(std::remove_if(attached_.begin(), attached_.end(),
                                 [](const std::weak_ptr<Unit>& u) { return u.expired(); }),
                  attached_.end());
  attached_.push_back(unit);
  return absl::OkStatus();
}

absl::Status Runtime::CheckIdle(const std::string& what) const {
  if (active_.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": a ", in_backward_ ? "backward" : "forward", " is in progress (unit ",
                   active_.back()->label(), " is computing)"));
}

void Runtime::Record(const std::string& event, const Unit* unit) {
  VLOG(1) << "fsdp " << event << (unit ? " " + unit->label() : "");
  if (!record_events_) return;
  events_.push_back(unit == nullptr ? event : absl::StrCat(event, " ", unit->label()));
}

bool Runtime::IsActive(const Unit* unit) const {
  for (const auto& u : active_) {
    if (u.get() == unit) return true;
  }
  return false;
}

int Runtime::NumAhead() const {
  int n = 0;
  for (const auto& weak : attached_) {
    std::shared_ptr<Unit> u = weak.lock();
    if (u == nullptr || IsActive(u.get()) || u->summoned()) continue;
    if (u->state() == UnitState::kUnsharding || u->state() == UnitState::kUnsharded) ++n;
  }
  return n;
}

absl::Status Runtime::IssueUnshard(Unit& unit) {
  if (unit.state() != UnitState::kSharded) return absl::OkStatus();
  RETURN_IF_ERROR(unit.IssueUnshard(/*full_precision=*/false));
  Record("allgather_issued", &unit);
  return absl::OkStatus();
}

absl::Status Runtime::Prefetch(const Unit& current, const std::vector<std::weak_ptr<Unit>>& order,
                               size_t* cursor) {
  size_t i = *cursor;
  while (i < order.size() && order[i].lock().get() != &current) ++i;
  if (i == order.size()) return absl::OkStatus();  // not in the recorded order
  *cursor = i + 1;
  const int limit = current.options().limit_all_gathers;
  int ahead = NumAhead();
  for (size_t j = i + 1; j < order.size() && ahead < limit; ++j) {
    std::shared_ptr<Unit> next = order[j].lock();
    if (next == nullptr || IsActive(next.get()) || next->summoned()) continue;
    if (next->state() != UnitState::kSharded) continue;
    RETURN_IF_ERROR(IssueUnshard(*next));
    ++ahead;
  }
  return absl::OkStatus();
}

void Runtime::Abort() {
  LOG(WARNING) << "fsdp: cleaning up a forward/backward that an error interrupted";
  Record("aborted_pass", nullptr);
  (void)FinishAllReductions();
  std::vector<std::weak_ptr<Unit>> units = forward_order_;
  for (const auto& u : active_) units.push_back(u);
  for (const auto& weak : units) {
    std::shared_ptr<Unit> u = weak.lock();
    if (u == nullptr || u->CheckUsable("clean up").ok() == false) continue;
    // Best effort: a unit that fails here is left kFailed and reports it next time.
    if (u->state() == UnitState::kUnsharding || u->state() == UnitState::kUnsharded) {
      if (u->flat().full_grad().defined()) (void)u->DropGradients();
      (void)u->Reshard();
    }
  }
  active_.clear();
  in_backward_ = false;
  forward_order_.clear();
  post_order_.clear();
  backward_order_.clear();
  pending_reductions_.clear();
}

absl::Status Runtime::ForwardPre(const std::shared_ptr<Unit>& unit) {
  RETURN_IF_ERROR(unit->CheckUsable("run forward"));
  RETURN_IF_ERROR(CheckNotSummoned(*unit, "forward"));
  if (core::InRecompute()) {
    // NOTE [Recompute]: gather for the backward that follows; no forward bookkeeping.
    if (!in_backward_ || active_.empty() || IsActive(unit.get())) {
      return absl::FailedPreconditionError(
          absl::StrCat("fsdp unit ", unit->label(),
                       ": a recomputed forward outside the backward of an enclosing unit"));
    }
    active_.push_back(unit);
    RETURN_IF_ERROR(IssueUnshard(*unit));
    if (unit->state() == UnitState::kUnsharding) RETURN_IF_ERROR(unit->FinishUnshard());
    Record("recompute_begin", unit.get());
    return absl::OkStatus();
  }
  if (IsActive(unit.get()) || (in_backward_ && active_.empty())) Abort();
  if (active_.empty()) {
    // NOTE [Root unit]: a new iteration starts.
    if (!pending_reductions_.empty()) RETURN_IF_ERROR(FinishAllReductions());
    previous_forward_order_ = std::move(forward_order_);
    forward_order_.clear();
    post_order_.clear();
    backward_order_.clear();
    forward_cursor_ = 0;
    in_backward_ = false;
  }
  active_.push_back(unit);
  forward_order_.push_back(unit);
  RETURN_IF_ERROR(IssueUnshard(*unit));
  if (unit->options().forward_prefetch) {
    RETURN_IF_ERROR(Prefetch(*unit, previous_forward_order_, &forward_cursor_));
  }
  if (unit->state() == UnitState::kUnsharding) RETURN_IF_ERROR(unit->FinishUnshard());
  Record("forward_compute_begin", unit.get());
  return absl::OkStatus();
}

absl::Status Runtime::ForwardPost(const std::shared_ptr<Unit>& unit) {
  if (active_.empty() || active_.back() != unit) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fsdp unit ", unit->label(), ": forward ended but it is not the innermost computing unit"));
  }
  active_.pop_back();
  if (core::InRecompute()) return absl::OkStatus();  // NOTE [Recompute]: stays gathered
  post_order_.push_back(unit);
  if (unit->reshard_after_forward()) {
    RETURN_IF_ERROR(unit->Reshard());
    Record("reshard", unit.get());
  }
  return absl::OkStatus();
}

absl::Status Runtime::BackwardPre(const std::shared_ptr<Unit>& unit) {
  RETURN_IF_ERROR(unit->CheckUsable("run backward"));
  RETURN_IF_ERROR(CheckNotSummoned(*unit, "backward"));
  if (IsActive(unit.get()) || (!in_backward_ && !active_.empty())) Abort();
  if (active_.empty()) {
    in_backward_ = true;
    backward_order_.assign(post_order_.rbegin(), post_order_.rend());
    backward_cursor_ = 0;
  }
  active_.push_back(unit);
  RETURN_IF_ERROR(IssueUnshard(*unit));
  if (unit->options().backward_prefetch) {
    RETURN_IF_ERROR(Prefetch(*unit, backward_order_, &backward_cursor_));
  }
  if (unit->state() == UnitState::kUnsharding) RETURN_IF_ERROR(unit->FinishUnshard());
  RETURN_IF_ERROR(unit->PrepareGradients());
  Record("backward_compute_begin", unit.get());
  return absl::OkStatus();
}

absl::Status Runtime::BackwardPost(const std::shared_ptr<Unit>& unit) {
  if (active_.empty() || active_.back() != unit) {
    return absl::FailedPreconditionError(
        absl::StrCat("fsdp unit ", unit->label(),
                     ": backward ended but it is not the innermost computing unit"));
  }
  active_.pop_back();
  // At most one reduction in flight: it keeps a full gradient buffer alive. (Host
  // gradient adds wait for the backward's end: NOTE [CPU offload].)
  RETURN_IF_ERROR(FinishAllReductions(/*host_gradients=*/false));
  RETURN_IF_ERROR(unit->ReduceGradients());
  if (unit->reduction_pending()) {
    pending_reductions_.push_back(unit);
    Record("reduce_issued", unit.get());
  }
  RETURN_IF_ERROR(unit->Reshard());
  Record("reshard", unit.get());
  if (active_.empty()) RETURN_IF_ERROR(EndBackward());
  return absl::OkStatus();
}

CommTiming Runtime::comm_timing() const {
  CommTiming total;
  for (const std::weak_ptr<Unit>& weak : attached_) {
    if (std::shared_ptr<Unit> unit = weak.lock()) total += unit->comm_timing();
  }
  return total;
}

void Runtime::ResetCommTiming() {
  for (const std::weak_ptr<Unit>& weak : attached_) {
    if (std::shared_ptr<Unit> unit = weak.lock()) unit->ResetCommTiming();
  }
}

absl::Status Runtime::FinishAllReductions(bool host_gradients) {
  absl::Status first;
  while (!pending_reductions_.empty()) {
    std::shared_ptr<Unit> u = pending_reductions_.front().lock();
    pending_reductions_.pop_front();
    if (u == nullptr || !u->reduction_pending()) continue;
    absl::Status s = u->FinishReduction();
    if (s.ok()) {
      Record("reduce_done", u.get());
    } else if (first.ok()) {
      first = s;
    }
  }
  if (!host_gradients) return first;
  for (const std::weak_ptr<Unit>& weak : attached_) {
    std::shared_ptr<Unit> u = weak.lock();
    if (u == nullptr || !u->host_gradients_pending()) continue;
    if (absl::Status s = u->FinishHostGradients(); !s.ok() && first.ok()) first = s;
  }
  return first;
}

absl::Status Runtime::EndBackward() {
  absl::Status status = FinishAllReductions();
  for (const auto& weak : forward_order_) {
    std::shared_ptr<Unit> u = weak.lock();
    if (u == nullptr || u->summoned()) continue;
    if (u->state() == UnitState::kUnsharding || u->state() == UnitState::kUnsharded) {
      absl::Status s = u->Reshard();
      if (s.ok()) {
        Record("reshard", u.get());
      } else if (status.ok()) {
        status = s;
      }
    }
  }
  in_backward_ = false;
  Record("backward_end", nullptr);
  return status;
}

}  // namespace fsdp
