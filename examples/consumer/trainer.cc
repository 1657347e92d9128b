// The consumer's trainer: Fit -> Validate -> Test -> Release of its own MLP on local
// ranks, wrapped by its own registered policy. Run without RANK in the environment, it
// starts --world_size copies of itself (comm::RunLocalRanks) and each copy is one rank.
// The test stage runs in a second StageRunner created over the first one's registry, as
// a stage-separated pipeline would, and reuses the units: 0 parameter bytes copied.
//
//   bazel run //:trainer -- --world_size=2 --steps=60
//
// It never sets up glog, so any log line the library wrote would show as glog's
// "Logging before InitGoogleLogging()" warning; progress lines come out on stdout.
// Exit status 0 when every stage ran and the checks at the end held.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/init_from_env.h"
#include "comm/launcher.h"
#include "core/status_macros.h"
#include "fsdp/registry.h"
#include "integration/stage_runner.h"
#include "mlp.h"
#include "policy/registry.h"

ABSL_FLAG(int, world_size, 2, "local ranks to start");
ABSL_FLAG(int64_t, steps, 60, "training steps of the fit stage");
ABSL_FLAG(int64_t, log_every, 20, "a progress line every this many steps");

namespace {

// The stage options, built from scratch each time (as each stage object of a pipeline
// would read its own config): the policy comes from the policy registry by name.
absl::StatusOr<integration::StageOptions> MakeOptions() {
  integration::StageOptions options;
  policy::PolicyParams params("StageOptions.wrap.policy (mlp_blocks)");
  params.Add("min_params", "100");
  ASSIGN_OR_RETURN(options.wrap.policy,
                   policy::PolicyRegistry::Global().Create("mlp_blocks", params));
  options.fit_steps = absl::GetFlag(FLAGS_steps);
  options.train_batch_size = 16;
  options.eval_batch_size = 16;
  options.eval_batches = 4;
  options.log_every = absl::GetFlag(FLAGS_log_every);
  return options;
}

std::string DescribeWrap(const integration::WrapReport& w) {
  if (!w.reused) {
    return absl::StrCat("wrapped fresh: ", w.units, " units, ", w.param_bytes_copied,
                        " parameter bytes copied");
  }
  return absl::StrCat("units reused ", w.units_reused, " of ", w.units, ", parameter bytes copied ",
                      w.param_bytes_copied);
}

absl::Status Check(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(absl::StrCat("check failed: ", what));
}

absl::Status RunRank() {
  ASSIGN_OR_RETURN(comm::Distributed dist, comm::InitFromEnv({}));
  const bool say = dist.group->rank() == 0;
  auto print = [&](const std::string& line) {
    if (!say) return;
    std::printf("consumer: %s\n", line.c_str());
    std::fflush(stdout);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<consumer::RegressionModule> module,
                   consumer::RegressionModule::Create({}));

  // Stage object 1: fit and validate.
  auto registry = std::make_shared<fsdp::WrapperRegistry>();
  ASSIGN_OR_RETURN(integration::StageOptions fit_options, MakeOptions());
  ASSIGN_OR_RETURN(auto fitter,
                   integration::StageRunner::Create(dist.group, fit_options, registry));
  ASSIGN_OR_RETURN(integration::FitResult fit, fitter->Fit(*module));
  print(absl::StrFormat("fit: %d steps, loss %.4f -> %.4f; %s", fit.losses.size(),
                        fit.losses.front(), fit.final_loss, DescribeWrap(fit.report.wrap)));
  ASSIGN_OR_RETURN(integration::EvalResult validate, fitter->Validate(*module));
  print(absl::StrFormat("validate (the fit runner): loss %.4f over %d samples; %s", validate.loss,
                        validate.count, DescribeWrap(validate.report.wrap)));

  // Stage object 2, created separately over the same registry: test, release.
  ASSIGN_OR_RETURN(integration::StageOptions test_options, MakeOptions());
  ASSIGN_OR_RETURN(auto tester,
                   integration::StageRunner::Create(dist.group, test_options, registry));
  ASSIGN_OR_RETURN(integration::EvalResult test, tester->Test(*module));
  print(
      absl::StrFormat("test (a second StageRunner, shared registry): loss %.4f over %d samples; %s",
                      test.loss, test.count, DescribeWrap(test.report.wrap)));
  RETURN_IF_ERROR(tester->Release(*module));
  integration::EvalOptions plain;
  plain.wrap = false;
  ASSIGN_OR_RETURN(integration::EvalResult released, tester->Test(*module, plain));
  print(absl::StrFormat("released: a plain module again (%d units left); test loss %.4f",
                        registry->NumUnits(), released.loss));

  RETURN_IF_ERROR(Check(fit.final_loss < 0.5 * fit.losses.front(), "the fit loss halved"));
  RETURN_IF_ERROR(Check(test.report.wrap.reused && test.report.wrap.units == 3 &&
                            test.report.wrap.units_reused == 3 &&
                            test.report.wrap.param_bytes_copied == 0,
                        "the second runner reuses all 3 units, copying nothing"));
  RETURN_IF_ERROR(Check(registry->NumUnits() == 0, "released"));
  RETURN_IF_ERROR(Check(std::abs(released.loss - test.loss) <= 1e-5 * (1 + std::abs(test.loss)),
                        absl::StrCat("the released module's test loss ", released.loss,
                                     " equals the wrapped one's ", test.loss)));
  print(absl::StrFormat(
      "summary: units reused by the second runner %d of %d, parameter bytes "
      "copied %d",
      test.report.wrap.units_reused, test.report.wrap.units, test.report.wrap.param_bytes_copied));
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Fits, validates, tests and releases an MLP on local ranks.");
  absl::ParseCommandLine(argc, argv);
  if (!comm::IsLaunchedRank()) {
    std::printf("consumer: starting %d local ranks\n", absl::GetFlag(FLAGS_world_size));
    std::fflush(stdout);
    absl::StatusOr<int> rc =
        comm::RunLocalRanks(absl::GetFlag(FLAGS_world_size), {argv + 1, argv + argc});
    if (!rc.ok()) {
      std::fprintf(stderr, "consumer: %s\n", rc.status().ToString().c_str());
      return 1;
    }
    std::printf("consumer: the ranks %s (exit status %d)\n", *rc == 0 ? "succeeded" : "failed",
                *rc);
    return *rc;
  }
  const absl::Status status = RunRank();
  if (!status.ok()) {
    std::fprintf(stderr, "consumer: rank %s failed: %s\n", std::getenv("RANK"),
                 status.ToString().c_str());
    return 1;
  }
  return 0;
}
