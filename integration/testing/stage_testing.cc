#include "integration/testing/stage_testing.h"

#include "absl/time/time.h"
#include "policy/wrap_policy.h"

namespace integration {
namespace testing {

GptModuleOptions TinyGpt(int64_t vocab, int64_t width, uint64_t seed) {
  GptModuleOptions o;
  o.model.vocab_size = vocab;
  o.model.block_size = 8;
  o.model.n_embd = width;
  o.model.n_layer = 2;
  o.model.n_head = 2;
  o.model.seed = seed;
  o.language.seed = seed + 1;
  o.seq_len = 8;
  o.warmup_steps = 2;
  return o;
}

StageOptions TinyStages(int rows, int64_t fit_steps, int64_t log_every) {
  StageOptions o;
  o.wrap.policy = policy::ModuleTypes({"TransformerBlock"});
  o.fit_steps = fit_steps;
  o.train_batch_size = rows;
  o.eval_batch_size = rows;
  o.eval_batches = 2;
  o.log_every = log_every;
  return o;
}

absl::Status RunRanks(int n, const comm::testing::RankFunction& fn) {
  comm::testing::ThreadRanksOptions options;
  options.timeout = absl::Seconds(120);
  return comm::testing::RunThreadRanks(n, fn, options);
}

absl::Status NoFailuresYet() {
  return ::testing::Test::HasFailure()
             ? absl::InternalError("a gtest assertion failed (reported above)")
             : absl::OkStatus();
}

}  // namespace testing
}  // namespace integration
