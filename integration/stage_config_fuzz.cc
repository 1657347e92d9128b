// Fuzz target: StageConfig text -> StageOptions (integration/stage_options.h), then
// Validate for a few world sizes. Any bytes must give options or an error, never a
// crash, an abort, a stack overflow (deep nesting) or a sanitizer report. Corpus:
// integration/testdata/stage_config_fuzz_corpus/.
#include <cstddef>
#include <cstdint>
#include <string>

#include "integration/stage_options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<integration::StageOptions> options = integration::ParseStageOptions(text);
  if (!options.ok()) return 0;
  for (int world_size : {1, 2, 3, 8}) (void)options->Validate(world_size);
  if (options->wrap.policy != nullptr) (void)options->wrap.policy->Name();
  return 0;
}
