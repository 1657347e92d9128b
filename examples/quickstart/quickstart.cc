// The common path in one program (README.md quotes it): a GPT, a wrap policy, FullyShard,
// a StageRunner's fit / test / release, and a checkpoint loaded into a fresh model.
//
//   bazel run //examples/quickstart -- --world_size=2 --out_dir=/tmp/quickstart
//
// Started by hand, it starts --world_size local CPU ranks of itself; under a launcher
// (comm/launch, torchrun, srun, mpirun) it is one rank of that job. Rank 0 prints what each
// stage did.
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "comm/rank_main.h"
#include "core/status_macros.h"
#include "fsdp/fully_shard.h"
#include "integration/gpt_module.h"
#include "integration/stage_runner.h"
#include "policy/wrap_policy.h"

ABSL_FLAG(int, world_size, 2, "local ranks to start when no launcher started this process");
ABSL_FLAG(std::string, out_dir, "/tmp/quickstart", "where the training checkpoint goes");

namespace {

absl::Status Train(const comm::Distributed& dist) {
  const bool root = dist.group->rank() == 0;

  // A model: a small GPT and its training step, learning a synthetic language whose
  // entropy floor is known exactly (integration/gpt_module.h).
  integration::GptModuleOptions model_options;
  ASSIGN_OR_RETURN(auto module, integration::GptTrainModule::Create(model_options));

  // A wrap policy: one FSDP unit per transformer block, the rest in the root's unit.
  integration::StageOptions options;
  options.wrap.policy = policy::ModuleTypes({"TransformerBlock"});
  options.fit_steps = 200;
  options.checkpoint_dir = absl::GetFlag(FLAGS_out_dir) + "/checkpoint";
  ASSIGN_OR_RETURN(auto runner, integration::StageRunner::Create(dist.group, options));

  // FullyShard wraps in place: the GPT and its Parameter objects stay the same objects.
  ASSIGN_OR_RETURN(auto handle,
                   fsdp::FullyShard(module->gpt(), dist.group, options.wrap, &runner->registry()));

  // Fit trains on those units and saves the checkpoint; Test reuses them, copying nothing.
  ASSIGN_OR_RETURN(integration::FitResult fit, runner->Fit(*module));
  ASSIGN_OR_RETURN(integration::EvalResult test, runner->Test(*module));
  if (root) {
    std::printf("fit: loss %.4f -> %.4f, units reused %lld of %lld\n", fit.losses.front(),
                fit.final_loss, static_cast<long long>(fit.report.wrap.units_reused),
                static_cast<long long>(fit.report.wrap.units));
    std::printf("test: loss %.4f (entropy floor %.4f), units reused %lld, bytes copied %lld\n",
                test.loss, module->EntropyFloor(),
                static_cast<long long>(test.report.wrap.units_reused),
                static_cast<long long>(test.report.wrap.param_bytes_copied));
  }

  // Release: a plain module again, holding the full trained weights on every rank.
  RETURN_IF_ERROR(runner->Release(*module));

  // The checkpoint loads into a fresh model (at any world size) and tests the same.
  ASSIGN_OR_RETURN(auto fresh, integration::GptTrainModule::Create(model_options));
  ASSIGN_OR_RETURN(auto tester, integration::StageRunner::Create(dist.group, options));
  RETURN_IF_ERROR(
      tester->LoadCheckpoint(*fresh, options.checkpoint_dir, /*optimizer=*/false).status());
  ASSIGN_OR_RETURN(integration::EvalResult again, tester->Test(*fresh));
  if (root) std::printf("checkpoint: loaded into a fresh model, test loss %.4f\n", again.loss);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return comm::RankMain("quickstart", absl::GetFlag(FLAGS_world_size), argc, argv, Train);
}
