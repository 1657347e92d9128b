#!/bin/bash
# The consumer's trainer end to end on 2 local ranks: every stage ran, the second
# StageRunner reused the units with 0 parameter bytes copied, progress lines say
# samples/s, and the library wrote no log line before logging was set up.
#   trainer_test.sh <trainer>   (its runfiles path; BUILD passes $(rootpath :trainer))
set -u
TRAINER="${1:?usage: trainer_test.sh <trainer>}"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

out="$(timeout 240 "$TRAINER" --world_size=2 --steps=60 --log_every=20 2>&1)"
status=$?
echo "$out"
[[ "$status" == 0 ]] || fail "the trainer exited with status $status"

expect() {
  grep -qF -- "$1" <<<"$out" || fail "no line with '$1'"
}
expect "[rank 0] consumer: fit: 60 steps"
expect "wrapped fresh: 3 units"
expect "[rank 0] consumer: validate (the fit runner):"
expect "[rank 0] consumer: test (a second StageRunner, shared registry):"
expect "units reused 3 of 3, parameter bytes copied 0"
expect "[rank 0] consumer: released: a plain module again (0 units left)"
expect "summary: units reused by the second runner 3 of 3, parameter bytes copied 0"
expect "consumer: the ranks succeeded (exit status 0)"
# Progress lines of a model without tokens.
expect "[rank 0] step    20/60"
expect "samples/s"
grep -qF "tokens/s" <<<"$out" && fail "a progress line says tokens/s for a model without tokens"
# No log output before the caller set up logging (it never does here).
grep -qF "Logging before InitGoogleLogging" <<<"$out" && fail "the library logged before InitGoogleLogging"
grep -qE '^(\[rank [0-9]+\] )?[IWEF][0-9]{4} ' <<<"$out" && fail "a glog line appeared"

if [[ "$failures" -gt 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASSED"
