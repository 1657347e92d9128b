#!/bin/bash
# plan_main end to end: a table on success, exit status 2 and a message for bad flag
# values (1 and absl's message for flags absl cannot parse).
#   plan_main_test.sh <plan_main>   (its runfiles path: policy/BUILD passes $(rootpath))
set -u
BIN="${1:?usage: plan_main_test.sh <plan_main>}"
TMP="${TEST_TMPDIR:-/tmp}"
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect_status STATUS NEEDLE ARGS...: runs plan_main with ARGS, checks the exit status
# and that stdout+stderr contain NEEDLE.
expect_status() {
  local want="$1" needle="$2"
  shift 2
  local out status
  out="$(timeout 60 "$BIN" "$@" 2>&1)"
  status=$?
  if [[ "$status" != "$want" ]]; then
    fail "plan_main $*: exit status $status, want $want; output:"$'\n'"$out"
  elif [[ "$out" != *"$needle"* ]]; then
    fail "plan_main $*: output lacks '$needle':"$'\n'"$out"
  fi
}

SMALL=(--model=gpt --vocab_size=64 --block_size=32 --n_embd=64 --n_layer=2 --n_head=4)

expect_status 0 "Wrap plan: 3 units, world size 8" "${SMALL[@]}" --world_size=8 \
  --policy=module_types --module_types=TransformerBlock
expect_status 0 "ZeRO-3 formula, Psi = padded numel" "${SMALL[@]}" --policy=never
expect_status 0 "units {" "${SMALL[@]}" --policy=always --print_proto
expect_status 0 "Model: MLP(8-16-4), 212 parameters" --model=mlp --mlp_sizes=8,16,4 \
  --policy size_based --min_num_params 100 --world_size 2
# The example rule is linked into the CLI, so it is selectable by name.
expect_status 0 "path_glob: blocks.0 matches blocks.*" "${SMALL[@]}" --policy=path_glob \
  --policy_params='pattern=blocks.*;every=2'

cat > "$TMP/policy.txt" <<'CONFIG'
any_of { name: "module_types" param { key: "types" value: "Mlp" } }
any_of { name: "size_based" param { key: "min_num_params" value: "1000000" } }
ignored_modules: "wpe"
CONFIG
expect_status 0 "Ignored: wpe.weight" "${SMALL[@]}" --policy_config="$TMP/policy.txt"
printf 'name: "always"\nbogus: 1\n' > "$TMP/bad.txt"
expect_status 2 "line 2, column 6" "${SMALL[@]}" --policy_config="$TMP/bad.txt"

# A 12-layer Gpt at world size 8 (sizes with padding: 121,300 elements per block and
# 56,700 in the root, neither a multiple of 8): the printed per-rank totals equal the
# ZeRO-3 formula with padded Psi, column by column.
out="$(timeout 60 "$BIN" --model=gpt --vocab_size=501 --block_size=64 --n_embd=100 --n_layer=12 \
  --n_head=4 --world_size=8 --policy=module_types --module_types=TransformerBlock 2>&1)"
plan_row="$(grep -F "plan (sum over units)" <<<"$out" | sed 's/.*units)//' | tr -s ' ')"
formula_row="$(grep -F "ZeRO-3 formula, Psi = padded numel" <<<"$out" | sed 's/.*numel//' | tr -s ' ')"
unpadded_row="$(grep -F "Psi = numel (no padding)" <<<"$out" | sed 's/.*padding)//' | tr -s ' ')"
if [[ -z "$plan_row" || "$plan_row" != "$formula_row" ]]; then
  fail "12-layer Gpt: plan row '$plan_row' != formula row '$formula_row':"$'\n'"$out"
fi
# 12 * 121,304 + 56,704 = 1,512,352 padded elements; 16 B each over 8 ranks = 3,024,704 B.
if [[ "$plan_row" != " 1,512,352 2.88 3,024,704 2.88 3,024,704" ]]; then
  fail "12-layer Gpt: unexpected plan row '$plan_row'"
fi
if [[ "$unpadded_row" == "$plan_row" ]]; then
  fail "12-layer Gpt: the unpadded formula should differ by the padding: '$unpadded_row'"
fi

# Bad flags: a message naming the problem, never a crash: absl's parser refuses what it
# cannot parse (status 1), plan_main what parses but is invalid (status 2).
expect_status 1 "Unknown command line flag 'bogus'" "${SMALL[@]}" --policy=never --bogus=1
expect_status 1 "Illegal value 'eight' specified for flag 'world_size'" "${SMALL[@]}" \
  --policy=never --world_size=eight
expect_status 2 "--world_size must be >= 1" "${SMALL[@]}" --policy=never --world_size=0
expect_status 2 "--model must be gpt or mlp" --model=cnn --policy=never
expect_status 2 "unknown wrap policy 'nope'; known policies: always, every_kth, module_types, never, path_glob, size_based" \
  "${SMALL[@]}" --policy=nope
expect_status 2 "give a policy" "${SMALL[@]}"
expect_status 2 "--mlp_sizes: 'x' is not an integer" --model=mlp --mlp_sizes=8,x --policy=never
expect_status 2 "--min_num_params: 'lots' is not an integer" "${SMALL[@]}" --policy=size_based \
  --min_num_params=lots
expect_status 2 "GptConfig.n_head" "${SMALL[@]}" --n_head=3 --policy=never
expect_status 2 "unexpected argument 'stray'" "${SMALL[@]}" --policy=never stray
expect_status 1 "Missing the value for the flag 'world_size'" "${SMALL[@]}" --policy=never \
  --world_size

# Bad input files and sizes: an error naming the problem, never a crash or a silent default.
expect_status 2 "policy config file '$TMP' is a directory" "${SMALL[@]}" --policy_config="$TMP"
printf 'name: "always"\n\x00\xff' > "$TMP/binary.txt"
expect_status 2 "is not a text file" "${SMALL[@]}" --policy_config="$TMP/binary.txt"
# negate { x 10,000 used to overflow the parser's stack (SIGSEGV).
{ for ((i = 0; i < 10000; ++i)); do printf 'negate { '; done
  printf 'name: "always"'
  for ((i = 0; i < 10000; ++i)); do printf ' }'; done; } > "$TMP/deep.txt"
expect_status 2 "nest at most 64 levels" "${SMALL[@]}" --policy_config="$TMP/deep.txt"
# A model that cannot be allocated: exit status 1 and the tensor named, not an abort.
expect_status 1 "wte.weight [1099511627776, 64]" --model=gpt --vocab_size=1099511627776 \
  --block_size=32 --n_embd=64 --n_layer=2 --n_head=4 --policy=never

if [[ "$failures" != 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all plan_main checks passed"
