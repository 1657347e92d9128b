#!/usr/bin/env bash
# run.sh: the GPU acceptance run's entry point (the run itself is run.py beside it; its
# docstring, and README.md, say what runs, in which order, with which settings).
#
#   tar xJf gpu_bundle.tar.xz -C /tmp && /tmp/gpu_bundle/run.sh [--call=1|2|all]
#
# Without Python it still prints the run's one JSON line, saying why nothing ran, and exits 1.
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if command -v "$PYTHON" >/dev/null 2>&1; then
  exec "$PYTHON" "$HERE/run.py" "$@"
fi
line="{\"gpu_run_summary\":1,\"ok\":false,\"error\":\"run.sh: $PYTHON not found: run.py needs Python 3.8+ (set PYTHON)\"}"
echo "run.sh: $PYTHON not found: run.py needs Python 3.8+ (set PYTHON)" >&2
if [ -n "${OUT:-}" ] && mkdir -p "$OUT"; then echo "$line" >"$OUT/summary.json"; fi
echo "$line"
exit 1
