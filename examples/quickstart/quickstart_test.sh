#!/bin/bash
# Runs README.md's complete example the way README.md shows it and checks what README.md says
# it prints: units reused and no parameter bytes copied by the test stage, a test loss near
# the language's entropy floor, the same test loss from the checkpoint loaded into a fresh
# model, and every line of README.md's sample output (numbers aside).
#   quickstart_test.sh <quickstart binary> <README.md>
set -u
BIN="${1:?usage: quickstart_test.sh <quickstart> <README.md>}"
README="${2:?usage: quickstart_test.sh <quickstart> <README.md>}"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

prefix='bazel run //examples/quickstart -- '
command_line="$(grep -m1 "^$prefix" "$README")"
[[ -n "$command_line" ]] || { echo "FAIL: $README shows no '$prefix' line"; exit 1; }
out_dir="${TEST_TMPDIR:-/tmp}/quickstart"
args=()
for arg in ${command_line#"$prefix"}; do
  case "$arg" in
    --out_dir=*) args+=("--out_dir=$out_dir") ;;
    *) args+=("$arg") ;;
  esac
done
echo "running: $BIN ${args[*]}"
out="$(timeout 240 "$BIN" "${args[@]}" 2>&1)"
status=$?
echo "$out"
[[ "$status" == 0 ]] || fail "the example exited with status $status"

num='[0-9]+(\.[0-9]+)?'
grep -qE "^\[rank 0\] fit: loss $num -> $num, units reused 3 of 3$" <<<"$out" ||
  fail "no fit line reusing the 3 hand-wrapped units"
test_line="$(grep -E "^\[rank 0\] test: loss $num \(entropy floor $num\), units reused 3, bytes copied 0$" <<<"$out")"
[[ -n "$test_line" ]] || fail "no test line reusing 3 units and copying 0 bytes"
test_loss="$(sed -nE 's/.*test: loss ([0-9.]+) .*/\1/p' <<<"$test_line")"
floor="$(sed -nE 's/.*entropy floor ([0-9.]+)\).*/\1/p' <<<"$test_line")"
if [[ -n "$test_loss" && -n "$floor" ]]; then
  awk -v l="$test_loss" -v f="$floor" 'BEGIN { exit !(l < f + 0.5) }' ||
    fail "test loss $test_loss is not within 0.5 of the entropy floor $floor"
fi
again="$(sed -nE 's/^\[rank 0\] checkpoint: loaded into a fresh model, test loss ([0-9.]+)$/\1/p' <<<"$out")"
[[ -n "$again" ]] || fail "no checkpoint line"
[[ "$again" == "$test_loss" ]] || fail "the checkpoint's test loss $again is not the trained model's $test_loss"
[[ -f "$out_dir/checkpoint/metadata.pb" ]] || fail "no checkpoint at $out_dir/checkpoint"

# README.md's sample output: the fenced block after "<!-- output of: examples/quickstart/
# quickstart_test.sh -->". Each of its lines, with every number read as any number, is a line
# of the real output ("..." stands for anything).
sample="$(awk '/<!-- output of: examples\/quickstart\/quickstart_test.sh -->/ { m = 1; next }
               m == 1 && /^```/ { m = 2; next }
               m == 2 && /^```/ { exit }
               m == 2 { print }' "$README")"
[[ -n "$sample" ]] || fail "$README has no sample output block marked as this test's output"
while IFS= read -r line; do
  [[ -z "$line" ]] && continue
  pattern="$(sed -E -e 's/[][\\.^$*+?(){}|/]/\\&/g' -e 's/[0-9]+(\\\.[0-9]+)?/[0-9]+(\\.[0-9]+)?/g' \
    -e 's/\\\.\\\.\\\./.*/g' <<<"$line")"
  grep -qE "^${pattern}\$" <<<"$out" || fail "README.md's sample line is not in the output: $line"
done <<<"$sample"

if [[ "$failures" -gt 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASSED"
