#!/usr/bin/env bash
# The cost of --deterministic (NOTE [Deterministic training] in integration/stage_options.h):
# the main job, normal and deterministic, at each world size, on the same GPT and batches
# (-c opt, gloo, 1 intra-op thread per rank in both modes, so only the mode differs).
# Prints one JSON document: per world size both runs' tokens/s after warm-up, the step-time
# ratio deterministic / normal, whether the deterministic losses equal the 1-rank run's
# bit for bit, and what the mode changes (its model of the cost).
#
#   bash bench/deterministic.sh                       # N = 1, 2, 4; V 256 T 64 C 128 L 4 H 4 B 32
#   WORLDS="2 4" STEPS=40 bash bench/deterministic.sh --n_embd=256
#
# Extra flags go to every run.
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build -c opt //trainer:main_job >&2
WORLDS=${WORLDS:-"1 2 4"}
STEPS=${STEPS:-30}
M=${MICRO_BATCHES:-8}
OUT=$(mktemp -d /tmp/deterministic_bench.XXXXXX)
common=(--vocab_size=256 --block_size=64 --seq_len=64 --n_embd=128 --n_layer=4 --n_head=4
        --batch_size=32 --steps="$STEPS" --log_every=10 --stages=fit --release=false
        --intra_op_threads=1 --backend=gloo "$@")
for n in $WORLDS; do
  bazel-bin/trainer/main_job --world_size="$n" --output_dir="$OUT/normal$n" "${common[@]}" \
    >"$OUT/normal$n.log" 2>&1
  bazel-bin/trainer/main_job --world_size="$n" --output_dir="$OUT/det$n" "${common[@]}" \
    --deterministic --deterministic_micro_batches="$M" >"$OUT/det$n.log" 2>&1
done
python3 - "$OUT" "$M" $WORLDS <<'PY'
import json, sys
out_dir, m, worlds = sys.argv[1], int(sys.argv[2]), [int(w) for w in sys.argv[3:]]
def summary(name):
    with open(f"{out_dir}/{name}/summary.json") as f:
        return json.load(f)
ref = summary(f"det{worlds[0]}")["fit_losses"]
runs = {}
for n in worlds:
    normal, det = summary(f"normal{n}"), summary(f"det{n}")
    tn, td = normal["tokens_per_second_after_warmup"], det["tokens_per_second_after_warmup"]
    runs[str(n)] = {
        "normal_tokens_per_s": tn,
        "deterministic_tokens_per_s": td,
        "step_time_ratio_deterministic_over_normal": tn / td if td else None,
        "micro_batches_per_rank": m // n,
        "deterministic_losses_equal_world_%d_bitwise" % worlds[0]: det["fit_losses"] == ref,
    }
print(json.dumps({
    "bench": "deterministic",
    "config": {"micro_batches": m, "batch_size": 32, "model": "V 256 T 64 C 128 L 4 H 4",
               "backend": "gloo", "intra_op_threads": 1},
    "model_of_the_cost": ("each rank runs M/N micro-batches of B/M rows instead of one batch "
                          "of B/N rows (smaller GEMMs, M/N forward/backward passes), keeps "
                          "log2(M/N)+1 full gradients per unit for the tree, and reduces with "
                          "log2(N) blocking 2-rank reduce-scatters (the same bytes as one "
                          "reduce-scatter, no overlap with the backward)"),
    "world_sizes": runs,
}, indent=1))
PY
