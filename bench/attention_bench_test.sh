#!/usr/bin/env bash
# bench/attention_bench and bench/attention_torch.py without a GPU: each prints its one JSON
# line (the bench: "built without CUDA" and exit 2, or, built with CUDA on a machine without
# a GPU, the CUDA error and exit 1), bad flags are refused, and both count the same model
# FLOPs for GPT-2's attention (B=16 T=1024 H=12 hd=64: 4 and 10 x B H T(T+1)/2 hd), ours
# also the FLOPs its 64 x 64 tiles execute.
set -euo pipefail
SCRIPT=${1:-bench/attention_torch.py}
BENCH=${2:-bazel-bin/bench/attention_bench}
T=$(mktemp -d "${TEST_TMPDIR:-/tmp}/attention_bench_test.XXXXXX")
failures=0
check() {
  local what=$1
  shift
  if "$@"; then echo "PASS: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}
json_check() {  # json_check <description> <file> <python expression over j, the last line>
  check "$1" python3 -c "import json,sys; j=json.loads(open(sys.argv[1]).read().splitlines()[-1]); sys.exit(0 if ($3) else 1)" "$2"
}

# ---- attention_bench --------------------------------------------------------------------
set +e
"$BENCH" --seq_len=64 --batch=1 --reps=1 --warmup=0 >"$T/bench.out" 2>"$T/bench.err"
rc=$?
"$BENCH" >"$T/gpt2.out" 2>/dev/null
"$BENCH" --head_dim=65 >"$T/bad.out" 2>/dev/null
bad_rc=$?
set -e
cat "$T/bench.out" "$T/bench.err"
# On a machine with a GPU and a CUDA build it runs (exit 0, or 1 for a failed entry).
json_check "bench: one JSON line, ok false with the reason unless it ran on a GPU" "$T/bench.out" \
  'j["attention_bench"] == 1 and ((j["ok"] is False and j["error"] and '"$rc"' in (1, 2)) or "forward" in j)'
json_check "bench: exit 2 and 'built without CUDA' only without CUDA" "$T/bench.out" \
  '('"$rc"' == 2) == ("built without CUDA (--config=cuda)" == j["error"])'
json_check "bench: the problem echoed" "$T/bench.out" \
  'j["shape"] == {"B": 1, "T": 64, "H": 12, "head_dim": 64, "out_bf16": True, "reps": 1, "warmup": 0}'
json_check "bench: GPT-2 model FLOPs, 4 and 10 x B H T(T+1)/2 hd" "$T/gpt2.out" \
  'j["flops"]["forward_model"] == 4 * 16 * 12 * 524800 * 64 and j["flops"]["backward_model"] == 10 * 16 * 12 * 524800 * 64'
json_check "bench: executed FLOPs over the 136 tiles on or below the diagonal (4 and 14 products)" "$T/gpt2.out" \
  'j["flops"]["forward_executed"] == 4 * 16 * 12 * 4096 * 136 * 64 and j["flops"]["backward_executed"] == 14 * 16 * 12 * 4096 * 136 * 64'
check "bench: a head width without a kernel is refused (exit 2)" [ "$bad_rc" = 2 ]
json_check "bench: ... with the reason in its JSON line" "$T/bad.out" \
  'j["ok"] is False and "--head_dim=65 has no fused kernel" in j["error"]'

# ---- attention_torch.py -----------------------------------------------------------------
check "torch: compiles" python3 -c "import sys; compile(open(sys.argv[1]).read(), sys.argv[1], 'exec')" "$SCRIPT"
help_works() { python3 "$SCRIPT" --help | grep -q -- "--seq_len"; }
check "torch: --help works without torch" help_works
refuses() { ! python3 "$SCRIPT" --reps=0 2>"$T/refused.err" && grep -q -- "--reps=0: must be positive" "$T/refused.err"; }
check "torch: --reps=0 is refused" refuses
set +e
python3 "$SCRIPT" >"$T/torch.out" 2>/dev/null
torch_rc=$?
set -e
# Without PyTorch or without CUDA: ok false, exit 1. With both (a GPU machine) it runs.
json_check "torch: one JSON line, ok false and exit 1 without PyTorch or CUDA" "$T/torch.out" \
  'j["attention_torch"] == 1 and ((j["ok"] is False and j["error"] and '"$torch_rc"' == 1) or "backends" in j)'
check "torch: the same model FLOPs as the bench" python3 - "$T/torch.out" "$T/gpt2.out" <<'PY'
import json, sys
torch_flops = json.loads(open(sys.argv[1]).read().splitlines()[-1])["flops"]
bench_flops = json.loads(open(sys.argv[2]).read().splitlines()[-1])["flops"]
assert torch_flops == {k: bench_flops[k] for k in ("forward_model", "backward_model")}, (torch_flops, bench_flops)
PY
echo "$failures failed"
[ "$failures" = 0 ]
