// Tests of SaveTrainingCheckpoint / LoadTrainingCheckpoint over thread ranks with the tiny
// Gpt of fsdp/testing/gpt_training.h: resharding a checkpoint to other world sizes,
// strategies and a plain module (bitwise), resuming training (bitwise), each rank reading
// only its part, crash safety, corruption and truncation, and the errors.
//
// Every comparison here is exact (float ==): loading copies stored float32 bits into the
// same elements, so nothing may change; resumed training repeats the same float operations
// in the same order on the same values (same world size, same layout, same batches), so
// it must repeat the same bits.
#include "integration/checkpointing/training_checkpoint.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/internal/metadata.h"
#include "checkpoint/sharded.h"
#include "comm/testing/thread_ranks.h"
#include "core/status_macros.h"
#include "data/markov_language.h"
#include "data/sampler.h"
#include "fsdp/fsdp.h"
#include "fsdp/testing/gpt_training.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/checkpointing/training_checkpoint.pb.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "optim/sgd.h"

namespace integration {
namespace {

using ::testing::HasSubstr;

// Parameter or checkpoint tensor name -> its full values, flattened.
using Values = std::map<std::string, std::vector<float>>;

fsdp::testing::GptTrainingSetup TinyRun() { return fsdp::testing::TinySetup(); }

std::string Dir(const std::string& name) { return ::testing::TempDir() + "/tc_" + name; }

comm::testing::ThreadRanksOptions RanksOptions() {
  comm::testing::ThreadRanksOptions o;
  o.timeout = absl::Seconds(60);  // the whole run; each is well under a second here
  return o;
}

absl::Status RunRanks(int n, const comm::testing::RankFunction& fn) {
  return comm::testing::RunThreadRanks(n, fn, RanksOptions());
}

absl::Status Expect(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

// OK when both maps hold the same names with bitwise-equal values; otherwise Internal
// naming the first difference.
absl::Status Same(const Values& expected, const Values& actual, const std::string& what) {
  if (expected.size() != actual.size()) {
    return absl::InternalError(
        absl::StrCat(what, ": ", expected.size(), " tensors vs ", actual.size()));
  }
  for (const auto& [name, e] : expected) {
    auto it = actual.find(name);
    if (it == actual.end()) return absl::InternalError(absl::StrCat(what, ": no '", name, "'"));
    const std::vector<float>& a = it->second;
    if (a.size() != e.size()) {
      return absl::InternalError(
          absl::StrCat(what, ": '", name, "' has ", a.size(), " elements, expected ", e.size()));
    }
    for (size_t k = 0; k < e.size(); ++k) {
      if (!(a[k] == e[k])) {
        return absl::InternalError(
            absl::StrCat(what, ": '", name, "'[", k, "] is ", a[k], ", expected ", e[k]));
      }
    }
  }
  return absl::OkStatus();
}

Values ToValues(const std::vector<std::pair<std::string, core::Tensor>>& tensors) {
  Values out;
  for (const auto& [name, t] : tensors) out[name] = t.ToVector();
  return out;
}

Values PlainValues(const core::Module& m) {
  Values out;
  for (auto& [name, v] : fsdp::testing::ParameterValues(m)) out[name] = std::move(v);
  return out;
}

// Every tensor of a checkpoint, in full.
absl::StatusOr<Values> Contents(const std::string& dir) {
  ASSIGN_OR_RETURN(auto all, checkpoint::LoadFull(dir));
  return ToValues(all);
}

// The optimizer's counters: step_count and the per-parameter step counts.
struct Counters {
  int64_t step_count = 0;
  std::map<std::string, int64_t> param_steps;
  bool operator==(const Counters& o) const {
    return step_count == o.step_count && param_steps == o.param_steps;
  }
};

Counters CountersOf(const optim::Optimizer& opt) {
  const optim::OptimizerState state = opt.State();
  Counters c;
  c.step_count = state.step_count;
  for (const auto& [name, n] : state.param_steps) c.param_steps[name] = n;
  return c;
}

// One rank's model (wrapped, or plain when made with no options) and AdamW over it.
struct Trainer {
  std::shared_ptr<nn::Gpt> gpt;
  std::unique_ptr<fsdp::WrapperRegistry> registry = std::make_unique<fsdp::WrapperRegistry>();
  std::shared_ptr<fsdp::FullyShardHandle> handle;
  std::unique_ptr<optim::AdamW> adamw;
  int rank = 0;
  int world_size = 1;
};

absl::StatusOr<std::unique_ptr<Trainer>> MakeTrainer(const fsdp::testing::GptTrainingSetup& setup,
                                                     comm::testing::RankContext* ctx,
                                                     const fsdp::FullyShardOptions* options) {
  auto t = std::make_unique<Trainer>();
  ASSIGN_OR_RETURN(t->gpt, fsdp::testing::MakeGpt(setup));
  if (options != nullptr) {
    ASSIGN_OR_RETURN(t->handle, fsdp::FullyShard(t->gpt, ctx->group, *options, t->registry.get()));
    t->rank = ctx->rank;
    t->world_size = ctx->world_size;
  }
  ASSIGN_OR_RETURN(t->adamw, optim::AdamW::Create(t->gpt->NamedParameters(), setup.adamw));
  return t;
}

absl::StatusOr<std::unique_ptr<Trainer>> MakeWrapped(comm::testing::RankContext& ctx,
                                                     const fsdp::FullyShardOptions& options) {
  return MakeTrainer(TinyRun(), &ctx, &options);
}

fsdp::FullyShardOptions FullShard() {
  return fsdp::testing::PerBlockOptions(fsdp::ShardingStrategy::kFullShard);
}

// Trains global batches [from, to) on this rank's rows; returns the rank's local losses.
absl::StatusOr<std::vector<double>> Train(Trainer& t, int from, int to) {
  const fsdp::testing::GptTrainingSetup setup = TinyRun();
  ASSIGN_OR_RETURN(data::MarkovLanguage language, fsdp::testing::MakeLanguage(setup));
  ASSIGN_OR_RETURN(data::RankSampler sampler, data::RankSampler::Create(t.rank, t.world_size));
  std::vector<double> losses;
  for (int step = from; step < to; ++step) {
    ASSIGN_OR_RETURN(data::TokenBatch global,
                     language.Batch(step, setup.global_batch, setup.seq_len));
    ASSIGN_OR_RETURN(data::TokenBatch local, sampler.Local(global));
    t.adamw->ZeroGrad();
    ASSIGN_OR_RETURN(double loss, fsdp::testing::ForwardBackward(*t.gpt, local));
    RETURN_IF_ERROR(t.adamw->Step());
    losses.push_back(loss);
  }
  return losses;
}

// The full parameters (a collective for a wrapped model).
absl::StatusOr<Values> Full(Trainer& t) {
  ASSIGN_OR_RETURN(fsdp::StateDict dict, fsdp::FullStateDict(*t.gpt, t.registry.get()));
  return ToValues(dict);
}

absl::Status Save(const std::string& dir, Trainer& t, comm::ProcessGroup* group,
                  const TrainingCheckpointOptions& options = {}) {
  return SaveTrainingCheckpoint(dir, *t.gpt, t.registry.get(), t.adamw.get(), group, options);
}

// What a saved run leaves to compare against.
struct SavedRun {
  Values params;      // full parameters at save time
  Values contents;    // every tensor of the checkpoint (model/ and optim/)
  Counters counters;  // rank 0's optimizer counters
};

// Trains `steps` at `world_size` under `options` and saves to `dir` with `step` = steps
// and user metadata {"run": "alpha"}.
absl::StatusOr<SavedRun> TrainAndSave(const std::string& dir, int world_size,
                                      const fsdp::FullyShardOptions& options, int steps,
                                      int64_t block_bytes = 0) {
  SavedRun run;
  RETURN_IF_ERROR(RunRanks(world_size, [&](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto t, MakeWrapped(ctx, options));
    RETURN_IF_ERROR(Train(*t, 0, steps).status());
    TrainingCheckpointOptions o;
    o.step = steps;
    o.user_metadata = {{"run", "alpha"}};
    o.block_bytes = block_bytes;
    RETURN_IF_ERROR(Save(dir, *t, ctx.group.get(), o));
    ASSIGN_OR_RETURN(Values full, Full(*t));
    if (ctx.rank == 0) {
      run.params = std::move(full);
      run.counters = CountersOf(*t->adamw);
    }
    return absl::OkStatus();
  }));
  ASSIGN_OR_RETURN(run.contents, Contents(dir));
  return run;
}

// Loads `dir` into a fresh wrapped model + AdamW on every rank of `world_size` and checks
// that the full parameters, the counters and (by saving the loaded state again to
// `resave_dir`) the full optimizer state equal `saved` bitwise.
absl::Status LoadAndCompare(const std::string& dir, const SavedRun& saved, int world_size,
                            const fsdp::FullyShardOptions& options, int saved_world_size,
                            const std::string& resave_dir) {
  RETURN_IF_ERROR(RunRanks(world_size, [&](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto t, MakeWrapped(ctx, options));
    ASSIGN_OR_RETURN(LoadedCheckpoint loaded,
                     LoadTrainingCheckpoint(dir, *t->gpt, t->registry.get(), t->adamw.get()));
    RETURN_IF_ERROR(Expect(loaded.step == saved.counters.step_count, "LoadedCheckpoint.step"));
    RETURN_IF_ERROR(Expect(loaded.saved_world_size == saved_world_size,
                           absl::StrCat("saved_world_size ", loaded.saved_world_size)));
    RETURN_IF_ERROR(Expect(loaded.has_optimizer_state && loaded.optimizer_type == "AdamW",
                           "optimizer_type " + loaded.optimizer_type));
    RETURN_IF_ERROR(
        Expect(loaded.user_metadata == std::map<std::string, std::string>{{"run", "alpha"}},
               "user_metadata"));
    RETURN_IF_ERROR(Expect(loaded.bytes_read > 0, "bytes_read"));
    ASSIGN_OR_RETURN(Values full, Full(*t));
    RETURN_IF_ERROR(Same(saved.params, full, "full parameters"));
    RETURN_IF_ERROR(Expect(CountersOf(*t->adamw) == saved.counters, "optimizer step counts"));
    TrainingCheckpointOptions o;
    o.step = loaded.step;
    o.user_metadata = loaded.user_metadata;
    return Save(resave_dir, *t, ctx.group.get(), o);
  }));
  ASSIGN_OR_RETURN(Values resaved, Contents(resave_dir));
  return Same(saved.contents, resaved, "checkpoint saved again after loading");
}

// 1. Saved at N = 2 (FULL_SHARD), loaded at N = 1..4 and into a plain module: parameters,
// optimizer state and step counts equal. Vocabulary and width 16 over 3 ranks give
// padded, uneven shards, so N = 3 exercises ranges that do not align with the saved ones.
TEST(TrainingCheckpointTest, SavedAtTwoLoadsAtOneToFourAndIntoAPlainModel) {
  const std::string dir = Dir("n2");
  absl::StatusOr<SavedRun> saved = TrainAndSave(dir, 2, FullShard(), 3);
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_EQ(saved->counters.step_count, 3);
  // Optimizer state and model parameters, one optim/ tensor per AdamW state.
  ASSERT_EQ(saved->contents.size(), 3 * saved->params.size());
  for (int n = 1; n <= 4; ++n) {
    absl::Status s =
        LoadAndCompare(dir, *saved, n, FullShard(), 2, Dir(absl::StrCat("n2_resaved_at_", n)));
    EXPECT_TRUE(s.ok()) << "N = " << n << ": " << s;
  }
  // Plain: no units, registry nullptr; every parameter whole.
  absl::StatusOr<std::unique_ptr<Trainer>> plain = MakeTrainer(TinyRun(), nullptr, nullptr);
  ASSERT_TRUE(plain.ok()) << plain.status();
  absl::StatusOr<LoadedCheckpoint> loaded =
      LoadTrainingCheckpoint(dir, *(*plain)->gpt, nullptr, (*plain)->adamw.get());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  absl::Status same = Same(saved->params, PlainValues(*(*plain)->gpt), "plain parameters");
  EXPECT_TRUE(same.ok()) << same;
  EXPECT_TRUE(CountersOf(*(*plain)->adamw) == saved->counters);
  const std::string resaved = Dir("n2_resaved_plain");
  absl::Status s =
      SaveTrainingCheckpoint(resaved, *(*plain)->gpt, nullptr, (*plain)->adamw.get(), nullptr, {});
  ASSERT_TRUE(s.ok()) << s;
  absl::StatusOr<Values> contents = Contents(resaved);
  ASSERT_TRUE(contents.ok()) << contents.status();
  same = Same(saved->contents, *contents, "plain checkpoint saved again");
  EXPECT_TRUE(same.ok()) << same;
  absl::StatusOr<LoadedCheckpoint> info = ReadTrainingCheckpointInfo(dir);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->step, 3);
  EXPECT_EQ(info->saved_world_size, 2);
  EXPECT_EQ(info->optimizer_type, "AdamW");
  EXPECT_EQ(info->user_metadata, (std::map<std::string, std::string>{{"run", "alpha"}}));
  EXPECT_EQ(info->bytes_read, 0);
}

// 2. K steps, save, load into a fresh model + optimizer at the same N, K more steps: the
// same losses and final parameters, bitwise, as 2K steps straight.
TEST(TrainingCheckpointTest, ResumedTrainingEqualsUninterrupted) {
  constexpr int kSteps = 3;
  const std::string dir = Dir("resume");
  absl::Status s = RunRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto straight, MakeWrapped(ctx, FullShard()));
    ASSIGN_OR_RETURN(std::vector<double> straight_losses, Train(*straight, 0, 2 * kSteps));
    ASSIGN_OR_RETURN(Values straight_params, Full(*straight));

    ASSIGN_OR_RETURN(auto first, MakeWrapped(ctx, FullShard()));
    ASSIGN_OR_RETURN(std::vector<double> losses, Train(*first, 0, kSteps));
    RETURN_IF_ERROR(Save(dir, *first, ctx.group.get(), {kSteps}));
    ASSIGN_OR_RETURN(auto second, MakeWrapped(ctx, FullShard()));
    ASSIGN_OR_RETURN(
        LoadedCheckpoint loaded,
        LoadTrainingCheckpoint(dir, *second->gpt, second->registry.get(), second->adamw.get()));
    ASSIGN_OR_RETURN(std::vector<double> more, Train(*second, loaded.step, 2 * kSteps));
    losses.insert(losses.end(), more.begin(), more.end());
    RETURN_IF_ERROR(Expect(losses.size() == straight_losses.size(), "number of losses"));
    for (size_t i = 0; i < losses.size(); ++i) {
      RETURN_IF_ERROR(Expect(losses[i] == straight_losses[i],
                             absl::StrCat("loss at step ", i, ": resumed ", losses[i],
                                          ", straight ", straight_losses[i])));
    }
    ASSIGN_OR_RETURN(Values resumed_params, Full(*second));
    return Same(straight_params, resumed_params, "final parameters (resumed vs straight)");
  });
  EXPECT_TRUE(s.ok()) << s;
}

// 3. At N = 4 a rank reads its quarter of a checkpoint saved at N = 2, plus at most the
// partial checksum blocks at the ends of what it asks for.
TEST(TrainingCheckpointTest, EachRankReadsOnlyItsPart) {
  // 16-byte blocks keep the slack small next to the ~1.5 KB a rank asks per tensor.
  constexpr int64_t kBlock = 16;
  const std::string dir = Dir("bytes");
  absl::StatusOr<SavedRun> saved = TrainAndSave(dir, 2, FullShard(), 2, kBlock);
  ASSERT_TRUE(saved.ok()) << saved.status();
  absl::StatusOr<checkpoint::CheckpointInfo> info = checkpoint::ReadMetadata(dir);
  ASSERT_TRUE(info.ok()) << info.status();
  int64_t total = 0;
  for (const checkpoint::TensorInfo& t : info->tensors) total += t.numel() * 4;  // float32
  std::vector<int64_t> read(4), requested(4), requests(4);
  absl::Status s = RunRanks(4, [&](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto t, MakeWrapped(ctx, FullShard()));
    ASSIGN_OR_RETURN(LoadedCheckpoint loaded,
                     LoadTrainingCheckpoint(dir, *t->gpt, t->registry.get(), t->adamw.get()));
    // What this rank asked for: its range of every parameter and of each state tensor.
    ASSIGN_OR_RETURN(std::vector<fsdp::ShardedTensor> parts,
                     fsdp::ShardedStateDict(*t->gpt, t->registry.get()));
    int64_t bytes = 0;
    for (const fsdp::ShardedTensor& p : parts) bytes += (p.end - p.begin) * 4;
    const optim::OptimizerState state = t->adamw->State();
    for (const auto& [key, tensor] : state.tensors) bytes += tensor.numel() * 4;
    read[ctx.rank] = loaded.bytes_read;
    requested[ctx.rank] = bytes;
    requests[ctx.rank] = static_cast<int64_t>(parts.size() + state.tensors.size());
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 4; ++r) {
    // A requested range overlaps at most 2 saved chunks (one per saving rank); in each,
    // the reader widens it to whole blocks, less than one extra block at either end.
    const int64_t slack = requests[r] * 2 * 2 * kBlock;
    EXPECT_GE(read[r], requested[r]) << "rank " << r;
    EXPECT_LE(read[r], requested[r] + slack) << "rank " << r;
    // Well below the whole: a quarter share plus slack stays under half here.
    EXPECT_LT(read[r], total / 2) << "rank " << r << " read " << read[r] << " of " << total;
    std::cout << "rank " << r << " of 4: read " << read[r] << " bytes, asked " << requested[r]
              << " in " << requests[r] << " ranges, of " << total << "\n";
  }
  // FULL_SHARD holds each element on exactly one rank: the requests partition the data.
  EXPECT_EQ(requested[0] + requested[1] + requested[2] + requested[3], total);
}

// 4. A save that crashes before the rename returns Aborted and leaves the first
// checkpoint in place, loadable with the first values.
TEST(TrainingCheckpointTest, CrashBeforeRenameKeepsThePreviousCheckpoint) {
  const std::string dir = Dir("crash");
  absl::Status s = RunRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto t, MakeWrapped(ctx, FullShard()));
    RETURN_IF_ERROR(Train(*t, 0, 2).status());
    RETURN_IF_ERROR(Save(dir, *t, ctx.group.get(), {2}));
    ASSIGN_OR_RETURN(Values first, Full(*t));
    RETURN_IF_ERROR(Train(*t, 2, 3).status());
    ASSIGN_OR_RETURN(Values later, Full(*t));
    RETURN_IF_ERROR(Expect(!Same(first, later, "").ok(), "the third step changed nothing"));
    TrainingCheckpointOptions o;
    o.step = 3;
    o.simulate_crash = checkpoint::SimulatedCrash::kBeforeRename;
    absl::Status crashed = Save(dir, *t, ctx.group.get(), o);
    RETURN_IF_ERROR(Expect(absl::IsAborted(crashed), "crashed save: " + crashed.ToString()));
    ASSIGN_OR_RETURN(auto fresh, MakeWrapped(ctx, FullShard()));
    ASSIGN_OR_RETURN(
        LoadedCheckpoint loaded,
        LoadTrainingCheckpoint(dir, *fresh->gpt, fresh->registry.get(), fresh->adamw.get()));
    RETURN_IF_ERROR(Expect(loaded.step == 2, absl::StrCat("loaded step ", loaded.step)));
    RETURN_IF_ERROR(Expect(fresh->adamw->step_count() == 2, "loaded optimizer step_count"));
    ASSIGN_OR_RETURN(Values got, Full(*fresh));
    return Same(first, got, "parameters after the crashed save");
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Saves a plain model (world of one, model only) to `dir`; returns the byte offset and
// size of each tensor in the one data file, which holds them back to back in save order.
struct Layout {
  std::string file;
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> tensors;  // offset, bytes
  size_t largest = 0;
};

absl::StatusOr<Layout> SavePlain(const std::string& dir, core::Module& model) {
  RETURN_IF_ERROR(SaveTrainingCheckpoint(dir, model, nullptr, nullptr, nullptr, {}));
  ASSIGN_OR_RETURN(checkpoint::CheckpointInfo info, checkpoint::ReadMetadata(dir));
  Layout layout;
  layout.file = dir + "/rank-00000-of-00001.bin";
  int64_t offset = 0;
  for (const checkpoint::TensorInfo& t : info.tensors) {
    layout.tensors.push_back({t.name, {offset, t.numel() * 4}});
    if (t.numel() * 4 > layout.tensors[layout.largest].second.second) {
      layout.largest = layout.tensors.size() - 1;
    }
    offset += t.numel() * 4;
  }
  // The layout assumption this test relies on (checkpoint/sharded.h: chunks back to back).
  if (static_cast<int64_t>(std::filesystem::file_size(layout.file)) != offset) {
    return absl::InternalError(absl::StrCat(layout.file, " is not ", offset, " bytes"));
  }
  return layout;
}

// A Gpt initialised differently from the saved one, to see that a refused load changes
// nothing.
absl::StatusOr<std::shared_ptr<nn::Gpt>> OtherGpt(int n_layer = 2, int n_embd = 16) {
  fsdp::testing::GptTrainingSetup setup = TinyRun();
  setup.gpt.seed = 99;
  setup.gpt.n_layer = n_layer;
  setup.gpt.n_embd = n_embd;
  return fsdp::testing::MakeGpt(setup);
}

// 5. A flipped byte inside a model tensor's chunk, and a file truncated inside one, are
// DataLoss naming the data file and that tensor; the model is left as it was.
TEST(TrainingCheckpointTest, CorruptedOrTruncatedDataIsDataLossNamingFileAndTensor) {
  absl::StatusOr<std::shared_ptr<nn::Gpt>> gpt = fsdp::testing::MakeGpt(TinyRun());
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  for (const bool truncate : {false, true}) {
    SCOPED_TRACE(truncate ? "truncated" : "flipped byte");
    const std::string dir = Dir(truncate ? "truncated" : "corrupted");
    absl::StatusOr<Layout> layout = SavePlain(dir, **gpt);
    ASSERT_TRUE(layout.ok()) << layout.status();
    const auto& [victim, where] = layout->tensors[layout->largest];
    const int64_t middle = where.first + where.second / 2;
    if (truncate) {
      std::filesystem::resize_file(layout->file, static_cast<uintmax_t>(middle));
    } else {
      std::fstream f(layout->file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(middle);
      char c = 0;
      f.read(&c, 1);
      c = static_cast<char>(c ^ 0x40);
      f.seekp(middle);
      f.write(&c, 1);
      ASSERT_TRUE(f.good());
    }
    absl::StatusOr<std::shared_ptr<nn::Gpt>> other = OtherGpt();
    ASSERT_TRUE(other.ok()) << other.status();
    const Values before = PlainValues(**other);
    absl::StatusOr<LoadedCheckpoint> loaded = LoadTrainingCheckpoint(dir, **other, nullptr);
    ASSERT_FALSE(loaded.ok());
    EXPECT_TRUE(absl::IsDataLoss(loaded.status())) << loaded.status();
    EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(layout->file));
    EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("'" + victim + "'"));
    absl::Status unchanged = Same(before, PlainValues(**other), "model after a refused load");
    EXPECT_TRUE(unchanged.ok()) << unchanged;
  }
}

// 6a. A model parameter the checkpoint lacks and a shape mismatch are FailedPrecondition
// (another structure) naming the parameter; neither writes to the model.
TEST(TrainingCheckpointTest, MissingOrMisshapedParameterIsRefusedBeforeWriting) {
  absl::StatusOr<std::shared_ptr<nn::Gpt>> gpt = fsdp::testing::MakeGpt(TinyRun());
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  const std::string dir = Dir("two_layers");
  ASSERT_TRUE(SavePlain(dir, **gpt).ok());
  const Values saved = PlainValues(**gpt);

  absl::StatusOr<std::shared_ptr<nn::Gpt>> deeper = OtherGpt(/*n_layer=*/3);
  ASSERT_TRUE(deeper.ok()) << deeper.status();
  std::string missing;  // the first parameter (NamedParameters() order) not saved
  for (const auto& [name, p] : (*deeper)->NamedParameters()) {
    if (missing.empty() && saved.count(name) == 0) missing = name;
  }
  ASSERT_FALSE(missing.empty());
  Values before = PlainValues(**deeper);
  absl::StatusOr<LoadedCheckpoint> loaded = LoadTrainingCheckpoint(dir, **deeper, nullptr);
  ASSERT_FALSE(loaded.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(loaded.status())) << loaded.status();
  EXPECT_THAT(std::string(loaded.status().message()),
              HasSubstr("model has parameter '" + missing + "' that the checkpoint lacks"));
  absl::Status unchanged = Same(before, PlainValues(**deeper), "model after a refused load");
  EXPECT_TRUE(unchanged.ok()) << unchanged;

  absl::StatusOr<std::shared_ptr<nn::Gpt>> wider = OtherGpt(2, /*n_embd=*/24);
  ASSERT_TRUE(wider.ok()) << wider.status();
  std::string misshaped;  // the first parameter whose size differs from the saved one
  for (const auto& [name, p] : (*wider)->NamedParameters()) {
    if (misshaped.empty() && p->data.numel() != static_cast<int64_t>(saved.at(name).size())) {
      misshaped = name;
    }
  }
  ASSERT_FALSE(misshaped.empty());
  before = PlainValues(**wider);
  loaded = LoadTrainingCheckpoint(dir, **wider, nullptr);
  ASSERT_FALSE(loaded.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(loaded.status())) << loaded.status();
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("parameter '" + misshaped + "'"));
  unchanged = Same(before, PlainValues(**wider), "model after a refused load");
  EXPECT_TRUE(unchanged.ok()) << unchanged;
}

// 6b. Asking for optimizer state a checkpoint does not hold (none, or another optimizer's)
// is FailedPrecondition.
TEST(TrainingCheckpointTest, OptimizerStateNotSavedOrOfAnotherTypeIsFailedPrecondition) {
  absl::StatusOr<std::unique_ptr<Trainer>> t = MakeTrainer(TinyRun(), nullptr, nullptr);
  ASSERT_TRUE(t.ok()) << t.status();
  const std::string model_only = Dir("model_only");
  ASSERT_TRUE(SavePlain(model_only, *(*t)->gpt).ok());
  absl::StatusOr<LoadedCheckpoint> loaded =
      LoadTrainingCheckpoint(model_only, *(*t)->gpt, nullptr, (*t)->adamw.get());
  EXPECT_TRUE(absl::IsFailedPrecondition(loaded.status())) << loaded.status();
  absl::StatusOr<LoadedCheckpoint> info = ReadTrainingCheckpointInfo(model_only);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->has_optimizer_state);
  EXPECT_EQ(info->optimizer_type, "");

  const std::string with_adamw = Dir("with_adamw");
  ASSERT_TRUE(
      SaveTrainingCheckpoint(with_adamw, *(*t)->gpt, nullptr, (*t)->adamw.get(), nullptr).ok());
  optim::SgdOptions sgd_options;
  sgd_options.momentum = 0.9;
  absl::StatusOr<std::unique_ptr<optim::SGD>> sgd =
      optim::SGD::Create((*t)->gpt->NamedParameters(), sgd_options);
  ASSERT_TRUE(sgd.ok()) << sgd.status();
  loaded = LoadTrainingCheckpoint(with_adamw, *(*t)->gpt, nullptr, sgd->get());
  EXPECT_TRUE(absl::IsFailedPrecondition(loaded.status())) << loaded.status();
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("AdamW"));
}

// Save-side errors: an optimizer over another module's parameters, a reserved metadata key.
TEST(TrainingCheckpointTest, SaveRefusesForeignOptimizerParametersAndReservedKeys) {
  absl::StatusOr<std::shared_ptr<nn::Gpt>> gpt = fsdp::testing::MakeGpt(TinyRun());
  absl::StatusOr<std::shared_ptr<nn::Gpt>> other = OtherGpt();
  ASSERT_TRUE(gpt.ok() && other.ok());
  absl::StatusOr<std::unique_ptr<optim::AdamW>> foreign =
      optim::AdamW::Create((*other)->NamedParameters(), TinyRun().adamw);
  ASSERT_TRUE(foreign.ok()) << foreign.status();
  const std::string dir = Dir("refused");
  absl::Status s = SaveTrainingCheckpoint(dir, **gpt, nullptr, foreign->get(), nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("'" + (*other)->NamedParameters().front().first + "'"));
  TrainingCheckpointOptions o;
  o.user_metadata = {{"fsdp.optimizer", "mine"}};
  s = SaveTrainingCheckpoint(dir, **gpt, nullptr, nullptr, nullptr, o);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("fsdp.optimizer"));
  EXPECT_FALSE(std::filesystem::exists(dir));  // nothing was written
}

// 6c. HYBRID_SHARD 2 x 2 at N = 4 (each shard written once although two replicas hold it)
// loads at N = 2 FULL_SHARD with equal parameters and optimizer state.
TEST(TrainingCheckpointTest, HybridShardAtFourLoadsAsFullShardAtTwo) {
  const std::string dir = Dir("hybrid");
  absl::StatusOr<SavedRun> saved = TrainAndSave(
      dir, 4, fsdp::testing::PerBlockOptions(fsdp::ShardingStrategy::kHybridShard, 2), 3);
  ASSERT_TRUE(saved.ok()) << saved.status();
  absl::Status s = LoadAndCompare(dir, *saved, 2, FullShard(), 4, Dir("hybrid_resaved"));
  EXPECT_TRUE(s.ok()) << s;
}

// ---------------------------------------------------------------------------------
// The training record: structure and optimizer, validated in full.

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The TrainingRecord of checkpoint `dir`.
absl::StatusOr<TrainingRecord> RecordOf(const std::string& dir) {
  const std::string path = dir + "/metadata.pb";
  ASSIGN_OR_RETURN(checkpoint::CheckpointMetadata meta,
                   checkpoint::internal::DecodeMetadataFile(ReadFile(path), path));
  TrainingRecord record;
  if (!record.ParseFromString(meta.records().at(kTrainingRecordKey))) {
    return absl::InternalError("the record does not parse");
  }
  return record;
}

// Copies checkpoint `from` to `to` with its record edited by `edit`, re-encoding the
// metadata with valid checksums: a forged (or buggy) record, not a damaged file.
absl::Status CopyWithRecord(const std::string& from, const std::string& to,
                            const std::function<void(TrainingRecord&)>& edit) {
  std::filesystem::remove_all(to);
  std::filesystem::copy(from, to, std::filesystem::copy_options::recursive);
  const std::string path = to + "/metadata.pb";
  ASSIGN_OR_RETURN(checkpoint::CheckpointMetadata meta,
                   checkpoint::internal::DecodeMetadataFile(ReadFile(path), path));
  TrainingRecord record;
  if (!record.ParseFromString(meta.records().at(kTrainingRecordKey))) {
    return absl::InternalError("the record does not parse");
  }
  edit(record);
  (*meta.mutable_records())[kTrainingRecordKey] = record.SerializeAsString();
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      << checkpoint::internal::EncodeMetadataFile(meta);
  return absl::OkStatus();
}

// 7. A 2-layer checkpoint into a 1-layer model: refused, naming the first tensor the
// model lacks, with nothing written; with LoadMode::kPartial the shared parameters load
// bitwise and everything skipped is reported.
TEST(TrainingCheckpointTest, TwoLayerCheckpointIntoOneLayerModelIsRefusedUnlessPartial) {
  absl::StatusOr<std::shared_ptr<nn::Gpt>> gpt = fsdp::testing::MakeGpt(TinyRun());
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  const std::string dir = Dir("two_into_one");
  ASSERT_TRUE(SavePlain(dir, **gpt).ok());
  const Values saved = PlainValues(**gpt);
  absl::StatusOr<std::shared_ptr<nn::Gpt>> shallow = OtherGpt(/*n_layer=*/1);
  ASSERT_TRUE(shallow.ok()) << shallow.status();
  const Values before = PlainValues(**shallow);

  absl::StatusOr<LoadedCheckpoint> loaded = LoadTrainingCheckpoint(dir, **shallow, nullptr);
  ASSERT_TRUE(absl::IsFailedPrecondition(loaded.status())) << loaded.status();
  EXPECT_THAT(std::string(loaded.status().message()),
              HasSubstr("checkpoint has tensor model/blocks.1."));
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("that the model lacks"));
  absl::Status unchanged = Same(before, PlainValues(**shallow), "model after a refused load");
  EXPECT_TRUE(unchanged.ok()) << unchanged;

  TrainingLoadOptions partial;
  partial.mode = LoadMode::kPartial;
  loaded = LoadTrainingCheckpoint(dir, **shallow, nullptr, nullptr, partial);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  Values expected;  // the saved values of the parameters the shallow model has
  std::vector<std::string> skipped;
  for (const auto& [name, v] : saved) {
    if (before.count(name)) {
      expected[name] = v;
    } else {
      skipped.push_back("model/" + name);
    }
  }
  ASSERT_EQ(expected.size(), before.size()) << "every shallow parameter is in the checkpoint";
  absl::Status same = Same(expected, PlainValues(**shallow), "partially loaded model");
  EXPECT_TRUE(same.ok()) << same;
  std::vector<std::string> reported = loaded->skipped_tensors;
  std::sort(reported.begin(), reported.end());
  EXPECT_EQ(reported, skipped);
  EXPECT_TRUE(loaded->unloaded_parameters.empty());
  EXPECT_THAT(loaded->structure_differences,
              ::testing::Contains("module <root> (Gpt): n_layer: checkpoint 2, model 1"));
}

// 8. n_head changes no shape, yet a checkpoint of an n_head = 2 model does not load into
// an n_head = 4 one: the structure records each module's configuration, and the caller's
// model_config is compared when the load gives one.
TEST(TrainingCheckpointTest, NHeadIsRecordedAndCompared) {
  const fsdp::testing::GptTrainingSetup setup = TinyRun();
  ASSERT_EQ(setup.gpt.n_head, 2);
  absl::StatusOr<std::shared_ptr<nn::Gpt>> gpt = fsdp::testing::MakeGpt(setup);
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  const std::string dir = Dir("n_head");
  TrainingCheckpointOptions o;
  o.model_config = {{"n_head", "2"}, {"n_layer", "2"}};
  ASSERT_TRUE(SaveTrainingCheckpoint(dir, **gpt, nullptr, nullptr, nullptr, o).ok());
  absl::StatusOr<LoadedCheckpoint> info = ReadTrainingCheckpointInfo(dir);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->model_config, o.model_config);
  EXPECT_EQ(info->structure_fingerprint.size(), 16u);

  fsdp::testing::GptTrainingSetup four = setup;
  four.gpt.n_head = 4;
  absl::StatusOr<std::shared_ptr<nn::Gpt>> other = fsdp::testing::MakeGpt(four);
  ASSERT_TRUE(other.ok()) << other.status();
  absl::StatusOr<LoadedCheckpoint> loaded = LoadTrainingCheckpoint(dir, **other, nullptr);
  ASSERT_TRUE(absl::IsFailedPrecondition(loaded.status())) << loaded.status();
  EXPECT_THAT(std::string(loaded.status().message()),
              HasSubstr("module <root> (Gpt): n_head: checkpoint 2, model 4"));
  TrainingLoadOptions expect;
  expect.model_config = {{"n_head", "4"}, {"n_layer", "2"}};
  loaded = LoadTrainingCheckpoint(dir, **other, nullptr, nullptr, expect);
  ASSERT_TRUE(absl::IsFailedPrecondition(loaded.status())) << loaded.status();
  EXPECT_THAT(std::string(loaded.status().message()),
              HasSubstr("model_config n_head: checkpoint 2, model 4"));

  // The same structure and configuration loads, and gives the same fingerprint.
  absl::StatusOr<std::shared_ptr<nn::Gpt>> same = OtherGpt();
  ASSERT_TRUE(same.ok()) << same.status();
  expect.model_config = o.model_config;
  loaded = LoadTrainingCheckpoint(dir, **same, nullptr, nullptr, expect);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->structure_fingerprint, info->structure_fingerprint);
  EXPECT_TRUE(loaded->structure_differences.empty());
}

// NOTE [Data identity]: the record keeps TrainingCheckpointOptions::data_identity, sorted;
// a record without one (as every checkpoint written before the field existed) loads with
// none; a forged repeated key is DataLoss and an empty key is refused at save.
TEST(TrainingCheckpointTest, DataIdentityIsRecordedAndARecordWithoutOneLoads) {
  absl::StatusOr<std::shared_ptr<nn::Gpt>> gpt = fsdp::testing::MakeGpt(TinyRun());
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  const std::string dir = Dir("data_identity");
  TrainingCheckpointOptions o;
  o.data_identity = {{"data.seed", "2"}, {"data.kind", "token_files"}};
  ASSERT_TRUE(SaveTrainingCheckpoint(dir, **gpt, nullptr, nullptr, nullptr, o).ok());
  absl::StatusOr<TrainingRecord> record = RecordOf(dir);
  ASSERT_TRUE(record.ok()) << record.status();
  ASSERT_EQ(record->data_identity_size(), 2);
  EXPECT_EQ(record->data_identity(0).key(), "data.kind");
  EXPECT_EQ(record->data_identity(1).value(), "2");
  absl::StatusOr<LoadedCheckpoint> info = ReadTrainingCheckpointInfo(dir);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->data_identity, o.data_identity);
  absl::StatusOr<std::shared_ptr<nn::Gpt>> same = OtherGpt();
  ASSERT_TRUE(same.ok()) << same.status();
  absl::StatusOr<LoadedCheckpoint> loaded = LoadTrainingCheckpoint(dir, **same, nullptr);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->data_identity, o.data_identity);

  const std::string old = Dir("data_identity_old");
  ASSERT_TRUE(CopyWithRecord(dir, old, [](TrainingRecord& r) { r.clear_data_identity(); }).ok());
  loaded = LoadTrainingCheckpoint(old, **same, nullptr);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->data_identity.empty());

  const std::string forged = Dir("data_identity_forged");
  ASSERT_TRUE(CopyWithRecord(dir, forged, [](TrainingRecord& r) {
                *r.add_data_identity() = r.data_identity(1);
              }).ok());
  info = ReadTrainingCheckpointInfo(forged);
  EXPECT_TRUE(absl::IsDataLoss(info.status())) << info.status();
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("data identity key 'data.seed'"));

  o.data_identity[""] = "x";
  const std::string refused = Dir("data_identity_refused");
  absl::Status s = SaveTrainingCheckpoint(refused, **gpt, nullptr, nullptr, nullptr, o);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("data_identity has an empty key"));
  EXPECT_FALSE(std::filesystem::exists(refused));
}

// NOTE [Data position]: kept like the identity, beside it; a record without one (written
// before the field existed) loads with none; a repeated key is DataLoss, an empty one
// refused at save.
TEST(TrainingCheckpointTest, DataPositionIsRecordedAndARecordWithoutOneLoads) {
  absl::StatusOr<std::shared_ptr<nn::Gpt>> gpt = fsdp::testing::MakeGpt(TinyRun());
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  const std::string dir = Dir("data_position");
  TrainingCheckpointOptions o;
  o.data_identity = {{"data.kind", "token_files"}};
  o.data_position = {{"data.window", "67"}, {"data.epoch", "1"}};
  ASSERT_TRUE(SaveTrainingCheckpoint(dir, **gpt, nullptr, nullptr, nullptr, o).ok());
  absl::StatusOr<TrainingRecord> record = RecordOf(dir);
  ASSERT_TRUE(record.ok()) << record.status();
  ASSERT_EQ(record->data_position_size(), 2);
  EXPECT_EQ(record->data_position(0).key(), "data.epoch");
  EXPECT_EQ(record->data_position(1).value(), "67");
  absl::StatusOr<LoadedCheckpoint> info = ReadTrainingCheckpointInfo(dir);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->data_position, o.data_position);
  EXPECT_EQ(info->data_identity, o.data_identity);
  absl::StatusOr<std::shared_ptr<nn::Gpt>> same = OtherGpt();
  ASSERT_TRUE(same.ok()) << same.status();
  absl::StatusOr<LoadedCheckpoint> loaded = LoadTrainingCheckpoint(dir, **same, nullptr);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->data_position, o.data_position);

  const std::string old = Dir("data_position_old");
  ASSERT_TRUE(CopyWithRecord(dir, old, [](TrainingRecord& r) { r.clear_data_position(); }).ok());
  loaded = LoadTrainingCheckpoint(old, **same, nullptr);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->data_position.empty());
  EXPECT_EQ(loaded->data_identity, o.data_identity);

  const std::string forged = Dir("data_position_forged");
  ASSERT_TRUE(CopyWithRecord(dir, forged, [](TrainingRecord& r) {
                *r.add_data_position() = r.data_position(1);
              }).ok());
  info = ReadTrainingCheckpointInfo(forged);
  EXPECT_TRUE(absl::IsDataLoss(info.status())) << info.status();
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("data position key 'data.window'"));

  o.data_position[""] = "x";
  const std::string refused = Dir("data_position_refused");
  absl::Status s = SaveTrainingCheckpoint(refused, **gpt, nullptr, nullptr, nullptr, o);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("data_position has an empty key"));
  EXPECT_FALSE(std::filesystem::exists(refused));
}

// 9. The optimizer record is checked entry by entry against the checkpoint's tensors: a
// renamed, missing or extra entry, impossible steps, or state reset to "never stepped"
// while its tensors remain, is DataLoss naming it, and nothing is loaded.
TEST(TrainingCheckpointTest, OptimizerRecordEntriesAreValidatedInFull) {
  absl::StatusOr<std::unique_ptr<Trainer>> t = MakeTrainer(TinyRun(), nullptr, nullptr);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(Train(**t, 0, 2).ok());
  const std::string dir = Dir("optim_record");
  TrainingCheckpointOptions o;
  o.step = 2;
  ASSERT_TRUE(SaveTrainingCheckpoint(dir, *(*t)->gpt, nullptr, (*t)->adamw.get(), nullptr, o).ok());
  absl::StatusOr<TrainingRecord> record = RecordOf(dir);
  ASSERT_TRUE(record.ok()) << record.status();
  ASSERT_TRUE(record->has_optimizer());
  const OptimizerRecord& opt = record->optimizer();
  EXPECT_EQ(opt.type(), "AdamW");
  EXPECT_EQ(opt.step_count(), 2);
  ASSERT_EQ(opt.parameters_size(), static_cast<int>((*t)->gpt->NamedParameters().size()));
  const std::string first = opt.parameters(0).parameter();
  EXPECT_EQ(opt.parameters(0).steps(), 2);

  struct Case {
    std::string name;
    std::function<void(TrainingRecord&)> edit;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"renamed entry",
       [&](TrainingRecord& r) {
         r.mutable_optimizer()->mutable_parameters(0)->set_parameter(first + "X");
       },
       "optimizer entry '" + first + "X' names no parameter"},
      {"missing entry",
       [&](TrainingRecord& r) {
         auto* ps = r.mutable_optimizer()->mutable_parameters();
         ps->erase(ps->begin());
       },
       "tensor optim/" + first + "/exp_avg belongs to no entry"},
      {"extra entry",
       [&](TrainingRecord& r) {
         ParameterOptimizerRecord* e = r.mutable_optimizer()->add_parameters();
         e->set_parameter("nope.weight");
         e->set_steps(1);
       },
       "optimizer entry 'nope.weight' names no parameter"},
      {"steps above step_count",
       [&](TrainingRecord& r) { r.mutable_optimizer()->mutable_parameters(0)->set_steps(3); },
       "optimizer entry '" + first + "' has taken 3 steps"},
      {"reset to never stepped",
       [&](TrainingRecord& r) {
         r.mutable_optimizer()->mutable_parameters(0)->set_steps(0);
         r.mutable_optimizer()->mutable_parameters(0)->clear_state();
       },
       "tensor optim/" + first + "/exp_avg belongs to no entry"},
      {"state list",
       [&](TrainingRecord& r) {
         r.mutable_optimizer()->mutable_parameters(0)->mutable_state()->RemoveLast();
       },
       "lists state [exp_avg], expected [exp_avg, exp_avg_sq]"},
      {"structure edited, fingerprint not",
       [&](TrainingRecord& r) { r.mutable_model()->mutable_modules(0)->set_type_name("NotGpt"); },
       "fingerprint"},
  };
  for (const Case& c : cases) {
    const std::string forged = Dir("optim_record_forged");
    ASSERT_TRUE(CopyWithRecord(dir, forged, c.edit).ok()) << c.name;
    absl::StatusOr<std::unique_ptr<Trainer>> fresh = MakeTrainer(TinyRun(), nullptr, nullptr);
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    const Values before = PlainValues(*(*fresh)->gpt);
    absl::StatusOr<LoadedCheckpoint> loaded =
        LoadTrainingCheckpoint(forged, *(*fresh)->gpt, nullptr, (*fresh)->adamw.get());
    EXPECT_TRUE(absl::IsDataLoss(loaded.status())) << c.name << ": " << loaded.status();
    EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(c.expect)) << c.name;
    EXPECT_TRUE(Same(before, PlainValues(*(*fresh)->gpt), c.name).ok()) << c.name;
    EXPECT_EQ((*fresh)->adamw->step_count(), 0) << c.name;
    EXPECT_TRUE(absl::IsDataLoss(ReadTrainingCheckpointInfo(forged).status())) << c.name;
  }
}

// 10. A parameter that never stepped is recorded explicitly (steps = 0) and starts fresh;
// an optimizer parameter the record has no entry for is refused rather than reset, and
// so is an entry for a parameter the optimizer does not manage (kPartial reports both).
TEST(TrainingCheckpointTest, NeverSteppedIsExplicitAndNothingIsSilentlyReset) {
  absl::StatusOr<std::unique_ptr<Trainer>> t = MakeTrainer(TinyRun(), nullptr, nullptr);
  ASSERT_TRUE(t.ok()) << t.status();
  const auto params = (*t)->gpt->NamedParameters();
  const std::string frozen = params.back().first;
  params.back().second->requires_grad = false;  // the optimizer skips it: never steps
  ASSERT_TRUE(Train(**t, 0, 2).ok());
  const Counters counters = CountersOf(*(*t)->adamw);
  ASSERT_EQ(counters.param_steps.count(frozen), 0u);
  const std::string dir = Dir("never_stepped");
  ASSERT_TRUE(SaveTrainingCheckpoint(dir, *(*t)->gpt, nullptr, (*t)->adamw.get(), nullptr).ok());
  absl::StatusOr<TrainingRecord> record = RecordOf(dir);
  ASSERT_TRUE(record.ok()) << record.status();
  const ParameterOptimizerRecord& last = *record->optimizer().parameters().rbegin();
  EXPECT_EQ(last.parameter(), frozen);
  EXPECT_EQ(last.steps(), 0);
  EXPECT_EQ(last.state_size(), 0);

  absl::StatusOr<std::unique_ptr<Trainer>> fresh = MakeTrainer(TinyRun(), nullptr, nullptr);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  absl::StatusOr<LoadedCheckpoint> loaded =
      LoadTrainingCheckpoint(dir, *(*fresh)->gpt, nullptr, (*fresh)->adamw.get());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(CountersOf(*(*fresh)->adamw) == counters);

  // The record lacks the frozen parameter's entry (its optimizer never managed it).
  const std::string lacking = Dir("never_stepped_lacking");
  ASSERT_TRUE(CopyWithRecord(dir, lacking, [](TrainingRecord& r) {
                r.mutable_optimizer()->mutable_parameters()->RemoveLast();
              }).ok());
  fresh = MakeTrainer(TinyRun(), nullptr, nullptr);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  loaded = LoadTrainingCheckpoint(lacking, *(*fresh)->gpt, nullptr, (*fresh)->adamw.get());
  ASSERT_TRUE(absl::IsFailedPrecondition(loaded.status())) << loaded.status();
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("'" + frozen + "'"));
  EXPECT_THAT(std::string(loaded.status().message()),
              HasSubstr("refusing to start its state fresh"));
  EXPECT_EQ((*fresh)->adamw->step_count(), 0);
  TrainingLoadOptions partial;
  partial.mode = LoadMode::kPartial;
  loaded = LoadTrainingCheckpoint(lacking, *(*fresh)->gpt, nullptr, (*fresh)->adamw.get(), partial);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->structure_differences.size(), 1u);
  EXPECT_THAT(loaded->structure_differences[0], HasSubstr("'" + frozen + "'"));
  EXPECT_TRUE(CountersOf(*(*fresh)->adamw) == counters);

  // An optimizer that does not manage a parameter the record has state for.
  std::vector<core::NamedParameter> fewer((*t)->gpt->NamedParameters());
  const std::string dropped = fewer.front().first;
  fewer.erase(fewer.begin());
  absl::StatusOr<std::unique_ptr<optim::AdamW>> partial_adamw =
      optim::AdamW::Create(fewer, TinyRun().adamw);
  ASSERT_TRUE(partial_adamw.ok()) << partial_adamw.status();
  loaded = LoadTrainingCheckpoint(dir, *(*t)->gpt, nullptr, partial_adamw->get());
  ASSERT_TRUE(absl::IsFailedPrecondition(loaded.status())) << loaded.status();
  EXPECT_THAT(std::string(loaded.status().message()),
              HasSubstr("state for parameter '" + dropped + "', which this AdamW does not manage"));
}

}  // namespace
}  // namespace integration
