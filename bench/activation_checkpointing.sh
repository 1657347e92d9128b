#!/usr/bin/env bash
# Activation checkpointing of every TransformerBlock: ours (bench:activation_checkpointing)
# and PyTorch's torch.utils.checkpoint (bench/activation_checkpointing_torch.py) on the same
# GPT, one process each, fp32, AdamW. Prints one JSON document: both sides' JSON lines and,
# for each, the checkpointed peak over the plain peak and the step-time ratio; ours also
# against the bound "rest + L x block input + one block" (peak_over_bound, target <= 1.05;
# step_time_ratio target <= 1.4).
#
#   bash bench/activation_checkpointing.sh                  # V 512, T 128, C 256, L 6, H 8, B 8
#   bash bench/activation_checkpointing.sh --n_layer=12 --steps=4
#
# Flags go to both sides. PyTorch comes from bench/cpu/setup.sh torch (a virtual environment
# under ~/.cache/fsdp_bench, set up on first use); without it the PyTorch side is skipped and
# said so in the JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build -c opt //bench:activation_checkpointing >&2
ours=$(bazel-bin/bench/activation_checkpointing "$@")
CACHE="${FSDP_BENCH_CACHE:-$HOME/.cache/fsdp_bench}"
torch_json='{"skipped": "no PyTorch virtual environment; run bash bench/cpu/setup.sh torch"}'
if bash bench/cpu/setup.sh torch >&2; then
  torch_json=$("$CACHE/torch-venv/bin/python" bench/activation_checkpointing_torch.py "$@" 2>/dev/null | tail -1)
fi
python3 - "$ours" "$torch_json" <<'PY'
import json, sys
ours, torch = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {"ours": ours, "pytorch": torch}
if "plain" in torch:
    out["held_after_forward_checkpointed_ours_over_pytorch"] = (
        ours["checkpointed"]["held_after_forward_bytes"] / torch["checkpointed"]["held_after_forward_bytes"])
    out["peak_checkpointed_ours_over_pytorch"] = (
        ours["checkpointed"]["peak_bytes"] / torch["checkpointed"]["peak_bytes"])
print(json.dumps(out, indent=1))
PY
