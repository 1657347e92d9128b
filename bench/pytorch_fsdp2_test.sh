#!/usr/bin/env bash
# bench/pytorch_fsdp2.py without PyTorch (none here): it compiles, --help and the flag
# checks work before torch is imported, its parameter count and FLOPs per token for
# GPT-2 124M are the ones run.sh uses for our MFU estimate (124475904 and 860101632), and
# its timing (on a stand-in torch.cuda whose events read a fake device clock) brackets each
# step with CUDA events and takes tokens/s from their total time.
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
check "timing: an event before the first step and after each; tokens/s over the events' total" \
  python3 - "$SCRIPT" <<'PY'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("pytorch_fsdp2", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)

class Clock:  # the device's clock: each step takes its time from `costs`
    now_ms, costs, recorded = 0.0, [10.0, 10.0, 40.0], []

class Event:
    def __init__(self, enable_timing=False):
        assert enable_timing
        self.t = None
    def record(self):
        self.t = Clock.now_ms
        Clock.recorded.append(self.t)
    def elapsed_time(self, other):
        return other.t - self.t

class Cuda:
    Event = Event
    synchronize = staticmethod(lambda: None)

class Torch:
    cuda = Cuda

class Loss:
    def detach(self):
        return self

def step():
    Clock.now_ms += Clock.costs.pop(0)
    return Loss()

# Untimed work before the timing (a warm-up) must not count.
Clock.now_ms = 500.0
step_ms, total_ms, wall, losses = m.time_steps(Torch, step, 3)
assert step_ms == [10.0, 10.0, 40.0], step_ms
assert total_ms == 60.0 and len(losses) == 3 and Clock.recorded == [500.0, 510.0, 520.0, 560.0]
f = m.timing_figures(step_ms, total_ms, 1.0, 3 * 1000)
# The mean step (20 ms) gives tokens/s; the median (10 ms) is reported beside it.
assert f["tokens_per_s"] == 3000 / 0.060 and f["step_ms_mean"] == 20.0, f
assert f["step_ms_median"] == 10.0 and f["step_ms_min"] == 10.0, f
assert f["wall_tokens_per_s"] == 3000.0 and "CUDA events" in f["timing_basis"], f
PY
echo "$failures failed"
[ "$failures" = 0 ]
