#!/usr/bin/env bash
# Fuzzes every fuzz_target of the repo (tools/fuzz/fuzz.bzl) for a bounded time each,
# with libFuzzer under clang, AddressSanitizer and UndefinedBehaviorSanitizer:
#
#   tools/fuzz/run.sh            # 60 s per target
#   tools/fuzz/run.sh 600        # 10 minutes per target
#   tools/fuzz/run.sh 60 //checkpoint:metadata_fuzz   # one target
#
# Builds in its own Bazel output base (clang, so the normal build's cache is untouched).
# Each target starts from its corpus in the repo (<package>/testdata/<name>_corpus/,
# copied; the repo is not written) and
# new crashing inputs land in out/fuzz/<target>/; the script exits non-zero if any
# target found one. The corpora also run as ordinary regression tests in `make test`
# (<target>_regression).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash tools/setup.sh
seconds="${1:-60}"
shift || true
output_base="${HOME}/.cache/bazel-fuzz/$(pwd | md5sum | cut -c1-16)"
bazel_cmd=(bazel --output_base="$output_base")
if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <("${bazel_cmd[@]}" query 'attr(tags, "fuzz_target", //...)' 2>/dev/null)
fi
"${bazel_cmd[@]}" build --config=fuzz "${targets[@]}"
bin="$("${bazel_cmd[@]}" info --config=fuzz bazel-bin 2>/dev/null)"
failed=0
for t in "${targets[@]}"; do
  pkg="${t#//}"; pkg="${pkg%%:*}"; name="${t##*:}"
  work="out/fuzz/${name}"
  rm -rf "$work" && mkdir -p "$work/corpus"
  cp -r "$pkg/testdata/${name}_corpus"/. "$work/corpus/"
  echo "fuzz: $t for ${seconds}s (corpus $(ls "$work/corpus" | wc -l) files)"
  if ! "$bin/$pkg/$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$work/" "$work/corpus" >"$work/log.txt" 2>&1; then
    echo "fuzz: $t FAILED; crashing input and log in $work/"
    tail -30 "$work/log.txt"
    failed=1
  else
    grep -E "^#[0-9]+.*DONE|Done [0-9]+ runs" "$work/log.txt" | tail -1 || true
  fi
done
exit $failed
