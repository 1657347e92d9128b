#!/usr/bin/env bash
# bench/pytorch_fsdp2.py without PyTorch (none here): it compiles, --help and the flag
# checks work before torch is imported, and its parameter count and FLOPs per token for
# GPT-2 124M are the ones run.sh uses for our MFU estimate (124475904 and 860101632).
set -euo pipefail
SCRIPT=${1:-bench/pytorch_fsdp2.py}
failures=0
check() {
  local what=$1
  shift
  if "$@"; then echo "PASS: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}
fails_with() {  # fails_with <text> <args...>: exit status 2 and <text> on stderr
  local want=$1 err rc=0
  shift
  err=$(python3 "$SCRIPT" "$@" 2>&1 >/dev/null) || rc=$?
  [ "$rc" = 2 ] && grep -q -- "$want" <<<"$err"
}
check "compiles" python3 -c "import sys; compile(open(sys.argv[1]).read(), sys.argv[1], 'exec')" "$SCRIPT"
help_works() { python3 "$SCRIPT" --help | grep -q -- "--batch_size"; }
check "--help works without torch" help_works
check "n_embd not a multiple of n_head is refused" fails_with "--n_embd=770 is not a multiple of --n_head=12" --n_embd=770
check "seq_len above block_size is refused" fails_with "--seq_len=2048: must be at most --block_size=1024" --seq_len=2048
check "a non-positive batch is refused" fails_with "--batch_size=0: must be positive" --batch_size=0
check "GPT-2 124M: parameters, FLOPs per token, peak guess" python3 - "$SCRIPT" <<'PY'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("pytorch_fsdp2", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
args = m.parse_args([])
assert (args.vocab_size, args.block_size, args.seq_len, args.n_embd, args.n_layer, args.n_head) == \
    (50304, 1024, 1024, 768, 12, 12), args
V, T, C, L = args.vocab_size, args.block_size, args.n_embd, args.n_layer
# What build_model's parameters() count (tied lm_head once): wte, wpe, per block ln_1,
# qkv, proj, ln_2, fc, proj; ln_f.
n = V * C + T * C + L * (2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C)) + 2 * C
assert n == 124475904, n
assert m.flops_per_token(args, n) == 860101632.0, m.flops_per_token(args, n)
assert m.peak_tflops_for("NVIDIA H200", 0) == 989.0
assert m.peak_tflops_for("NVIDIA H200", 500) == 500
assert m.peak_tflops_for("Some GPU", 0) == 0.0
PY
echo "$failures failed"
[ "$failures" = 0 ]
