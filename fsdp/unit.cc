#include "fsdp/unit.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/allocator.h"
#include "core/cuda_status.h"
#include "core/op_profile.h"
#include "core/status_macros.h"
#include "fsdp/device_ops.h"

namespace fsdp {

CommTiming& CommTiming::operator+=(const CommTiming& other) {
  all_gathers += other.all_gathers;
  all_gather_run += other.all_gather_run;
  all_gather_wait += other.all_gather_wait;
  reductions += other.reductions;
  reduce_run += other.reduce_run;
  reduce_wait += other.reduce_wait;
  return *this;
}

void CommTiming::Count(bool all_gather, absl::Duration run, absl::Duration wait) {
  if (all_gather) {
    ++all_gathers;
    all_gather_run += run;
    all_gather_wait += wait;
  } else {
    ++reductions;
    reduce_run += run;
    reduce_wait += wait;
  }
}

double CommTiming::Hidden(absl::Duration run, absl::Duration wait) {
  if (run <= absl::ZeroDuration()) return 0.0;
  const double hidden = 1.0 - absl::FDivDuration(wait, run);
  return std::min(1.0, std::max(0.0, hidden));
}
std::string UnitStateName(UnitState state) {
  switch (state) {
    case UnitState::kSharded:
      return "sharded";
    case UnitState::kUnsharding:
      return "unsharding";
    case UnitState::kUnsharded:
      return "unsharded";
    case UnitState::kFailed:
      return "failed";
    case UnitState::kReleased:
      return "released";
  }
  return "unknown";
}

absl::StatusOr<std::shared_ptr<Unit>> Unit::Create(const std::shared_ptr<core::Module>& module,
                                                   std::unique_ptr<flatten::FlatParameter> flat,
                                                   UnitGroups groups,
                                                   const FullyShardOptions& options) {
  if (module == nullptr || flat == nullptr) {
    return absl::InvalidArgumentError("fsdp::Unit::Create: null module or FlatParameter");
  }
  if (flat->world_size() != groups.shard_size || flat->rank() != groups.shard_rank) {
    return absl::FailedPreconditionError(
        absl::StrCat("fsdp unit ", module->Describe(), ": FlatParameter is rank ", flat->rank(),
                     " of ", flat->world_size(), " but the shard group is rank ", groups.shard_rank,
                     " of ", groups.shard_size));
  }
  std::shared_ptr<Unit> unit(new Unit());
  unit->label_ = module->Describe();
  unit->module_ = module;
  unit->module_ptr_ = module.get();
  unit->flat_ = std::move(flat);
  unit->groups_ = std::move(groups);
  unit->options_ = options;
  RETURN_IF_ERROR(unit->flat_->ShardViews());
  RETURN_IF_ERROR(unit->flat_->FreeFull());
  unit->state_ = UnitState::kSharded;
  return unit;
}

Unit::~Unit() { hooks_.clear(); }

bool Unit::reshard_after_forward() const {
  return options_.strategy == ShardingStrategy::kFullShard ||
         options_.strategy == ShardingStrategy::kHybridShard;
}

absl::Status Unit::CheckUsable(const std::string& what) const {
  if (state_ == UnitState::kFailed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fsdp unit ", label_, ": cannot ", what, " after an earlier error: ", failure_.message()));
  }
  if (state_ == UnitState::kReleased) {
    return absl::FailedPreconditionError(
        absl::StrCat("fsdp unit ", label_, ": cannot ", what, ": the unit was released"));
  }
  return absl::OkStatus();
}

absl::Status Unit::CheckState(UnitState expected, const std::string& what) const {
  RETURN_IF_ERROR(CheckUsable(what));
  if (state_ != expected) {
    return absl::FailedPreconditionError(absl::StrCat("fsdp unit ", label_, ": ", what,
                                                      " needs state ", UnitStateName(expected),
                                                      " but the unit is ", UnitStateName(state_)));
  }
  return absl::OkStatus();
}

namespace {

// NOTE [Op accounting] (core/op_profile.h) of a collective over `ranks` ranks: the bus
// bytes of a ring, (ranks - 1) / ranks of the full buffer per pass, as NCCL's busbw counts
// them (an all-reduce makes two passes: reduce-scatter, then all-gather).
void RecordCollective(const char* name, const core::Tensor& full_buffer, int ranks,
                      int passes = 1) {
  const double bus_bytes = static_cast<double>(full_buffer.nbytes()) * passes * (ranks - 1) / ranks;
  core::RecordOp(core::OpCategory::kCollective, name,
                 core::OpCost{0, bus_bytes, 1, core::OpEngine::kCollective});
}

}  // namespace

absl::Status Unit::WaitCounted(std::shared_ptr<comm::Work>& work, bool host, bool gather) {
  const absl::Time wait_start = absl::Now();
  RETURN_IF_ERROR(host ? work->WaitHost(options_.timeout) : work->Wait(options_.timeout));
  if (const std::optional<absl::Duration> run = work->RunTime(); run.has_value()) {
    comm_timing_.Count(gather, *run, absl::Now() - wait_start);
  } else if (!host) {
    stream_timed_.emplace_back(std::move(work), gather);
    if (stream_timed_.size() > kMaxStreamTimed) stream_timed_.pop_front();
    CountStreamTimings();
  }
  work.reset();
  return absl::OkStatus();
}

void Unit::CountStreamTimings() {
  for (auto it = stream_timed_.begin(); it != stream_timed_.end();) {
    const auto& [work, gather] = *it;
    const std::optional<comm::Work::StreamTiming> t = work->StreamWaitTiming();
    if (!t.has_value()) {
      // A failed collective never gets one (a completed Work's Wait returns its status at
      // once): dropped. Anything else is still running or not yet passed by the compute
      // stream (or its backend never gives one: kept until kMaxStreamTimed pushes it out).
      if (work->IsCompleted() && !work->Wait(absl::ZeroDuration()).ok()) {
        it = stream_timed_.erase(it);
      } else {
        ++it;
      }
      continue;
    }
    comm_timing_.Count(gather, t->run, t->wait);
    it = stream_timed_.erase(it);
  }
}

CommTiming Unit::comm_timing() {
  CountStreamTimings();
  return comm_timing_;
}

void Unit::ResetCommTiming() {
  comm_timing_ = CommTiming();
  stream_timed_.clear();
}

absl::Status Unit::Fail(const absl::Status& status) {
  failure_ = core::Annotate(status, absl::StrCat("fsdp unit ", label_));
  state_ = UnitState::kFailed;
  return failure_;
}

absl::Status Unit::IssueUnshard(bool full_precision) {
  RETURN_IF_ERROR(CheckState(UnitState::kSharded, "unshard"));
  const core::DType dtype =
      full_precision ? core::DType::kFloat32 : options_.mixed_precision.param_dtype;
  full_exact_ = dtype == core::DType::kFloat32;
  // NOTE [Mixed precision on the device]: the gathered param_dtype buffer is the full
  // buffer itself; the layers compute with its views.
  if (absl::Status s = flat_->AllocateFull(dtype); !s.ok()) return Fail(s);
  gather_output_ = flat_->full();
  core::Tensor source = flat_->shard();
  comm::AllGatherOptions ag;
  ag.timeout = options_.timeout;
  if (groups_.shard != nullptr && (flat_->shard_on_host() || !full_exact_)) {
    // The all-gather itself casts the shard to param_dtype (and, NOTE [CPU offload], brings
    // a host shard to the device first), on its own stream: NOTE [Staged collectives] in
    // comm/process_group.h. The cast overlaps whatever the compute stream runs meanwhile.
    absl::StatusOr<core::Tensor> in = core::Tensor::Allocate(
        {flat_->shard_numel()}, dtype, core::MemoryTag::kComm, flat_->device());
    if (!in.ok()) return Fail(in.status());
    gather_input_ = *std::move(in);
    ag.stage_from = source;
  } else if (groups_.shard != nullptr) {
    gather_input_ = source;  // an fp32 shard on the device, gathered as it is
  } else {
    // One-rank shard group: the shard is the whole buffer, copied (and cast) into it in
    // one pass on the compute stream, from the device copy of a host shard.
    if (flat_->shard_on_host()) {
      absl::StatusOr<core::Tensor> staged = core::Tensor::Allocate(
          {flat_->shard_numel()}, flat_->dtype(), core::MemoryTag::kComm, flat_->device());
      if (!staged.ok()) return Fail(staged.status());
      if (absl::Status s = staged->CopyFromAsync(source); !s.ok()) return Fail(s);
      source = *std::move(staged);
    }
    if (absl::Status s = internal::ConvertInto(gather_output_, source, "fsdp unit " + label_);
        !s.ok()) {
      return Fail(s);
    }
  }
  if (groups_.shard != nullptr) {
    RecordCollective("all_gather", gather_output_, groups_.shard->size());
    absl::StatusOr<std::shared_ptr<comm::Work>> work =
        groups_.shard->AllGather(gather_input_, gather_output_, ag);
    if (!work.ok()) return Fail(work.status());
    gather_work_ = *std::move(work);
  }
  state_ = UnitState::kUnsharding;
  return absl::OkStatus();
}

absl::Status Unit::FinishUnshard() {
  RETURN_IF_ERROR(CheckState(UnitState::kUnsharding, "finish unsharding"));
  if (gather_work_ != nullptr) {
    if (absl::Status s = WaitCounted(gather_work_, /*host=*/false, /*gather=*/true); !s.ok()) {
      return Fail(s);
    }
  }
  gather_input_ = core::Tensor();
  gather_output_ = core::Tensor();
  if (absl::Status s = flat_->MarkFullFilled(); !s.ok()) return Fail(s);
  if (absl::Status s = flat_->FullViews(); !s.ok()) return Fail(s);
  state_ = UnitState::kUnsharded;
  return absl::OkStatus();
}

absl::Status Unit::Reshard() {
  if (state_ == UnitState::kUnsharding) RETURN_IF_ERROR(FinishUnshard());
  RETURN_IF_ERROR(CheckState(UnitState::kUnsharded, "reshard"));
  if (absl::Status s = flat_->ShardViews(); !s.ok()) return Fail(s);
  if (absl::Status s = flat_->FreeFull(); !s.ok()) return Fail(s);
  state_ = UnitState::kSharded;
  full_exact_ = false;
  return absl::OkStatus();
}

absl::Status Unit::WriteBackLocalChunk() {
  RETURN_IF_ERROR(CheckState(UnitState::kUnsharded, "write back"));
  if (!full_exact_) {
    return absl::FailedPreconditionError(
        absl::StrCat("fsdp unit ", label_, ": cannot write back from a ",
                     core::DTypeName(options_.mixed_precision.param_dtype),
                     " unshard; it would overwrite the float32 master shard with rounded values"));
  }
  if (absl::Status s = flat_->CopyFullToShard(); !s.ok()) return Fail(s);
  return absl::OkStatus();
}

absl::Status Unit::WriteShard(int64_t shard_offset, const core::Tensor& values) {
  RETURN_IF_ERROR(CheckState(UnitState::kSharded, "write the shard"));
  if (flat_->shard_on_host()) {
    // NOTE [CPU offload]: an unshard's copy may still be reading the host shard.
    if (absl::Status s = core::cuda::Synchronize(flat_->device()); !s.ok()) return Fail(s);
  }
  if (shard_offset < 0 || shard_offset + values.numel() > flat_->shard_numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fsdp unit ", label_, ": writing ", values.numel(), " elements at shard offset ",
        shard_offset, " would leave the shard of ", flat_->shard_numel(), " elements"));
  }
  ASSIGN_OR_RETURN(core::Tensor dst, flat_->shard().View(shard_offset, {values.numel()}));
  core::Tensor src = values.Flat();
  if (src.dtype() != dst.dtype()) {
    if (src.device() == dst.device()) return internal::ConvertInto(dst, src, "fsdp unit " + label_);
    if (src.device().is_cpu()) {
      // Convert on the host, then one copy to the device.
      ASSIGN_OR_RETURN(src, src.ToDType(dst.dtype(), core::MemoryTag::kOther));
    }
  }
  return dst.CopyFrom(src);
}

absl::Status Unit::PrepareGradients() {
  RETURN_IF_ERROR(CheckState(UnitState::kUnsharded, "prepare gradients"));
  RETURN_IF_ERROR(FinishHostGradients());
  if (!flat_->full_grad().defined()) {
    // A new accumulation: keep what the gradient shard holds for parameters whose grad
    // still views it, and restart the others (their grad was dropped) from zero.
    if (!flat_->shard_grad().defined()) {
      if (absl::Status s = flat_->AllocateShardGrad(); !s.ok()) return Fail(s);
    } else {
      // One memset for each run of adjacent slices to restart (the frozen parameters'
      // slices between them, which nothing writes, go along): after ZeroGrad(set_to_none)
      // one for the whole shard.
      const core::Tensor& shard_grad = flat_->shard_grad();
      int64_t begin = 0, end = 0;
      auto flush = [&]() -> absl::Status {
        if (end > begin) {
          ASSIGN_OR_RETURN(core::Tensor part, shard_grad.View(begin, {end - begin}));
          RETURN_IF_ERROR(part.TryZero());
        }
        begin = end = 0;
        return absl::OkStatus();
      };
      for (size_t i = 0; i < flat_->records().size(); ++i) {
        const flatten::ParamRecord& record = flat_->records()[i];
        const flatten::ShardSlice& slice = record.shards[flat_->rank()];
        if (record.requires_grad && flat_->params()[i]->grad.SharesStorage(shard_grad)) {
          if (absl::Status s = flush(); !s.ok()) return Fail(s);  // kept: ends a run
          continue;
        }
        if (slice.empty()) continue;
        if (end > begin && slice.shard_offset == end) {
          end += slice.numel();
          continue;
        }
        if (absl::Status s = flush(); !s.ok()) return Fail(s);
        begin = slice.shard_offset;
        end = begin + slice.numel();
      }
      if (absl::Status s = flush(); !s.ok()) return Fail(s);
    }
    // One rank reducing in fp32 (nothing to scatter, round or add): the backward adds
    // straight into the gradient shard, without a second buffer to zero and add.
    const bool into_shard = groups_.shard == nullptr && groups_.replicate == nullptr &&
                            !options_.deterministic && !flat_->shard_on_host() &&
                            options_.mixed_precision.reduce_dtype == core::DType::kFloat32 &&
                            flat_->world_size() == 1;
    absl::Status s = into_shard ? flat_->UseShardGradAsFullGrad()
                                : flat_->AllocateFullGrad(core::DType::kFloat32);
    if (!s.ok()) return Fail(s);
  }
  if (absl::Status s = flat_->FullGradViews(); !s.ok()) return Fail(s);
  return absl::OkStatus();
}

absl::Status Unit::ReduceGradients() {
  RETURN_IF_ERROR(CheckState(UnitState::kUnsharded, "reduce gradients"));
  if (!flat_->full_grad().defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat("fsdp unit ", label_,
                     ": reduce gradients without a full gradient buffer (did the "
                     "backward pre-hook run?)"));
  }
  if (reduce_pending_) {
    return absl::FailedPreconditionError(
        absl::StrCat("fsdp unit ", label_, ": a reduction is already pending"));
  }
  if (options_.deterministic) return ReduceDeterministic();
  if (no_sync_) return absl::OkStatus();  // keep accumulating locally
  if (flat_->full_grad_is_shard_grad()) {
    // PrepareGradients: the backward added into the shard itself; nothing to reduce.
    if (absl::Status s = flat_->ShardGradViews(); !s.ok()) return Fail(s);
    if (absl::Status s = flat_->FreeFullGrad(); !s.ok()) return Fail(s);
    return absl::OkStatus();
  }
  // NOTE [CPU offload]: the staging buffer is free once the last chunk was added.
  if (flat_->shard_on_host()) RETURN_IF_ERROR(FinishHostGradients());
  const core::DType dtype = options_.mixed_precision.reduce_dtype;
  if (dtype == core::DType::kFloat32) {
    reduce_input_ = flat_->full_grad();
  } else {
    absl::StatusOr<core::Tensor> in =
        internal::Convert(flat_->full_grad(), dtype, core::MemoryTag::kComm, "fsdp unit " + label_);
    if (!in.ok()) return Fail(in.status());
    reduce_input_ = *std::move(in);
  }
  if (groups_.shard != nullptr) {
    absl::StatusOr<core::Tensor> out = core::Tensor::Allocate(
        {flat_->shard_numel()}, dtype, core::MemoryTag::kComm, flat_->device());
    if (!out.ok()) return Fail(out.status());
    reduce_output_ = *std::move(out);
    comm::ReduceScatterOptions rs;
    rs.reduce_op = comm::ReduceOp::kAverage;
    rs.timeout = options_.timeout;
    if (flat_->shard_on_host() && groups_.replicate == nullptr) {
      // NOTE [CPU offload]: the reduction brings its chunk to the host itself.
      absl::StatusOr<core::Tensor> staging = HostStaging(dtype);
      if (!staging.ok()) return Fail(staging.status());
      rs.unstage_to = *std::move(staging);
    } else if (!flat_->shard_on_host() && groups_.replicate == nullptr) {
      // The chunk's add into the gradient shard is the reduction's post-processing, done
      // where it runs (on NCCL, its stream), not on the compute stream.
      rs.accumulate_into = flat_->shard_grad();
    }
    reduce_accumulates_ = rs.accumulate_into.defined();
    RecordCollective("reduce_scatter", reduce_input_, groups_.shard->size());
    absl::StatusOr<std::shared_ptr<comm::Work>> work =
        groups_.shard->ReduceScatter(reduce_input_, reduce_output_, rs);
    if (!work.ok()) return Fail(work.status());
    reduce_work_ = *std::move(work);
  } else {
    reduce_output_ = reduce_input_;  // one-rank shard group: the chunk is everything
  }
  reduce_pending_ = true;
  if (absl::Status s = flat_->ShardGradViews(); !s.ok()) return Fail(s);
  if (absl::Status s = flat_->FreeFullGrad(); !s.ok()) return Fail(s);
  return absl::OkStatus();
}

absl::Status Unit::ReduceDeterministic() {
  // NOTE [Deterministic reduction]: this backward's gradient joins the tree of the step's
  // micro-batches; the one outside no_sync() finishes it and sums it across the ranks.
  if (absl::Status s = micro_batches_.Add(flat_->full_grad()); !s.ok()) return Fail(s);
  if (absl::Status s = flat_->ShardGradViews(); !s.ok()) return Fail(s);
  if (absl::Status s = flat_->FreeFullGrad(); !s.ok()) return Fail(s);
  if (no_sync_) return absl::OkStatus();
  absl::StatusOr<core::Tensor> partial = micro_batches_.Finish();
  if (!partial.ok()) {
    return Fail(core::Annotate(partial.status(),
                               "FullyShardOptions.deterministic: the micro-batches of a step"));
  }
  if (groups_.tree == nullptr) {
    reduce_output_ = *std::move(partial);  // one rank: the sum is the shard
  } else {
    absl::StatusOr<core::Tensor> out = core::Tensor::Allocate(
        {flat_->shard_numel()}, core::DType::kFloat32, core::MemoryTag::kComm, flat_->device());
    if (!out.ok()) return Fail(out.status());
    // Scattered over the shard group's levels of the tree, all-reduced over the rest.
    absl::StatusOr<int> levels = comm::TreeLevels(groups_.shard_size);
    if (!levels.ok()) return Fail(levels.status());
    RecordCollective("reduce_scatter", *partial, groups_.shard_size);
    if (absl::Status s = groups_.tree->ReduceScatter(*partial, *out, *levels); !s.ok()) {
      return Fail(s);
    }
    reduce_output_ = *std::move(out);
  }
  reduce_pending_ = true;
  return absl::OkStatus();
}

absl::StatusOr<core::Tensor> Unit::HostStaging(core::DType dtype) {
  if (!reduce_host_.defined() || reduce_host_.dtype() != dtype) {
    core::ScopedAllocator pinned(core::Allocator::PinnedHost());
    ASSIGN_OR_RETURN(reduce_host_,
                     core::Tensor::Allocate({flat_->shard_numel()}, dtype, core::MemoryTag::kComm,
                                            core::Device::Cpu()));
  }
  return reduce_host_;
}

absl::Status Unit::FinishReduction() {
  if (!reduce_pending_) return absl::OkStatus();
  RETURN_IF_ERROR(CheckUsable("finish a gradient reduction"));
  const bool offload = flat_->shard_on_host();
  if (reduce_work_ != nullptr && offload && groups_.replicate == nullptr) {
    // NOTE [CPU offload]: it copies its chunk to the host; FinishHostGradients waits.
    host_work_ = std::move(reduce_work_);
  } else if (reduce_work_ != nullptr) {
    if (absl::Status s = WaitCounted(reduce_work_, /*host=*/false, /*gather=*/false); !s.ok()) {
      return Fail(s);
    }
  }
  if (groups_.replicate != nullptr && !options_.deterministic) {  // the tree did it
    comm::AllReduceOptions ar;
    ar.reduce_op = comm::ReduceOp::kAverage;
    ar.timeout = options_.timeout;
    if (offload) {
      absl::StatusOr<core::Tensor> staging = HostStaging(reduce_output_.dtype());
      if (!staging.ok()) return Fail(staging.status());
      ar.unstage_to = *std::move(staging);
    }
    RecordCollective("all_reduce", reduce_output_, groups_.replicate->size(), /*passes=*/2);
    absl::StatusOr<std::shared_ptr<comm::Work>> work =
        groups_.replicate->AllReduce(reduce_output_, ar);
    if (!work.ok()) return Fail(work.status());
    if (offload) {
      host_work_ = *std::move(work);
    } else if (absl::Status s = (*work)->Wait(options_.timeout); !s.ok()) {
      return Fail(s);
    }
  }
  if (offload) {
    if (host_work_ == nullptr) {
      // No collective carried it (a one-rank group): the copy is queued on the compute
      // stream, and FinishHostGradients synchronises the device.
      absl::StatusOr<core::Tensor> staging = HostStaging(reduce_output_.dtype());
      if (!staging.ok()) return Fail(staging.status());
      if (absl::Status s = staging->CopyFromAsync(reduce_output_); !s.ok()) return Fail(s);
    }
    host_add_pending_ = true;
  } else if (reduce_accumulates_) {
    // The reduce-scatter added it (its Work is complete, or on CUDA ordered before what
    // the compute stream runs next).
  } else if (absl::Status s =
                 internal::AddInto(flat_->shard_grad(), reduce_output_, "fsdp unit " + label_);
             !s.ok()) {
    return Fail(s);
  }
  reduce_input_ = core::Tensor();
  reduce_output_ = core::Tensor();
  reduce_pending_ = false;
  reduce_accumulates_ = false;
  return absl::OkStatus();
}

absl::Status Unit::FinishHostGradients() {
  if (!host_add_pending_) return absl::OkStatus();
  RETURN_IF_ERROR(CheckUsable("add a gradient into the host shard"));
  if (host_work_ != nullptr) {
    if (absl::Status s = WaitCounted(host_work_, /*host=*/true, /*gather=*/false); !s.ok()) {
      return Fail(s);
    }
  } else if (absl::Status s = core::cuda::Synchronize(flat_->device()); !s.ok()) {
    return Fail(s);
  }
  host_add_pending_ = false;
  if (absl::Status s = internal::AddInto(flat_->shard_grad(), reduce_host_, "fsdp unit " + label_);
      !s.ok()) {
    return Fail(s);
  }
  return absl::OkStatus();
}

absl::Status Unit::DropGradients() {
  RETURN_IF_ERROR(CheckUsable("drop gradients"));
  if (reduce_pending_) RETURN_IF_ERROR(FinishReduction());
  if (host_work_ != nullptr) {
    // The gradients it would add to are dropped; its copy must still land first. Where
    // the wait fails the copy may still come: the staging buffer is let go, not reused.
    if (!host_work_->WaitHost(options_.timeout).ok()) reduce_host_ = core::Tensor();
    host_work_.reset();
  }
  host_add_pending_ = false;
  micro_batches_ = comm::TreeAccumulator(core::MemoryTag::kGrad);
  if (absl::Status s = flat_->ClearGradViews(); !s.ok()) return Fail(s);
  if (absl::Status s = flat_->FreeFullGrad(); !s.ok()) return Fail(s);
  if (absl::Status s = flat_->FreeShardGrad(); !s.ok()) return Fail(s);
  return absl::OkStatus();
}

absl::Status Unit::Release() {
  RETURN_IF_ERROR(CheckUsable("release"));
  if (summoned_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fsdp unit ", label_, ": cannot release inside SummonFullParams; close it first"));
  }
  RETURN_IF_ERROR(DropGradients());
  if (state_ == UnitState::kUnsharding) RETURN_IF_ERROR(FinishUnshard());
  if (state_ == UnitState::kUnsharded && !full_exact_) RETURN_IF_ERROR(Reshard());
  if (state_ == UnitState::kSharded) {
    RETURN_IF_ERROR(IssueUnshard(/*full_precision=*/true));
    RETURN_IF_ERROR(FinishUnshard());
  }
  if (absl::Status s = flat_->Unflatten(); !s.ok()) return Fail(s);
  hooks_.clear();
  state_ = UnitState::kReleased;
  return absl::OkStatus();
}

}  // namespace fsdp
