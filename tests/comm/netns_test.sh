#!/bin/bash
# Multi-host test on one machine: two network namespaces ("hosts") joined by a veth
# pair, each with its own address. Rank 0 runs in host A (10.77.0.1) and serves the
# TcpStore there; rank 1 runs in host B (10.77.0.2). They meet over TcpStore through
# MASTER_ADDR=10.77.0.1 and run gloo over those addresses: InitFromEnv must pick the
# address that routes to MASTER_ADDR (each namespace has only its own), and every
# collective is checked by comm_worker.
#
# Needs root and iproute2 (`ip netns`). Where the machine does not allow namespaces
# the test prints "SKIPPED: <reason>" and passes.
#
# Usage (from Bazel): netns_test.sh <path to comm_worker>
set -u

skip() {
  echo "SKIPPED: $*"
  exit 0
}

WORKER=${1:?usage: netns_test.sh <comm_worker>}
[ "$(id -u)" = 0 ] || skip "creating network namespaces needs root (uid is $(id -u))"
command -v ip >/dev/null 2>&1 || skip "iproute2's ip command is not installed"

TAG="fsdp$$"
NSA="${TAG}a"
NSB="${TAG}b"
VA="va$$"
VB="vb$$"
LOGDIR="${TEST_TMPDIR:-/tmp}/netns_$$"
mkdir -p "$LOGDIR"
PIDS=""

cleanup() {
  for p in $PIDS; do kill -9 "$p" 2>/dev/null; done
  ip netns del "$NSA" 2>/dev/null
  ip netns del "$NSB" 2>/dev/null  # deleting a namespace deletes its end of the veth pair
}
trap cleanup EXIT

if ! err=$(ip netns add "$NSA" 2>&1); then
  skip "ip netns add failed: $err"
fi
if ! err=$(ip netns exec "$NSA" true 2>&1); then
  skip "ip netns exec failed: $err"
fi
set -e
ip netns add "$NSB"
ip link add "$VA" type veth peer name "$VB"
ip link set "$VA" netns "$NSA"
ip link set "$VB" netns "$NSB"
ip -n "$NSA" addr add 10.77.0.1/24 dev "$VA"
ip -n "$NSB" addr add 10.77.0.2/24 dev "$VB"
for ns in "$NSA" "$NSB"; do ip -n "$ns" link set lo up; done
ip -n "$NSA" link set "$VA" up
ip -n "$NSB" link set "$VB" up
set +e

run_rank() {  # namespace rank log
  ip netns exec "$1" env RANK="$2" WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
    MASTER_ADDR=10.77.0.1 MASTER_PORT=29511 \
    timeout 40 "$WORKER" --mode=collectives --timeout_s=20 >"$3" 2>&1
}
# Rank 1 first: its store client must retry until rank 0's server is up.
run_rank "$NSB" 1 "$LOGDIR/rank1.log" &
P1=$!
PIDS="$P1"
sleep 0.3
run_rank "$NSA" 0 "$LOGDIR/rank0.log" &
P0=$!
PIDS="$P0 $P1"
wait "$P0"; RC0=$?
wait "$P1"; RC1=$?
PIDS=""

echo "--- rank 0 (host A, 10.77.0.1), exit $RC0"; cat "$LOGDIR/rank0.log"
echo "--- rank 1 (host B, 10.77.0.2), exit $RC1"; cat "$LOGDIR/rank1.log"

fail=0
check() {  # file pattern what
  if ! grep -qF "$2" "$1"; then
    echo "FAIL: $3 (no \"$2\" in $(basename "$1"))"
    fail=1
  fi
}
[ "$RC0" = 0 ] || { echo "FAIL: rank 0 exited with $RC0"; fail=1; }
[ "$RC1" = 0 ] || { echo "FAIL: rank 1 exited with $RC1"; fail=1; }
check "$LOGDIR/rank0.log" "joined gloo group 'world' (rank 0 of 2) on 10.77.0.1" "rank 0 uses host A's address"
check "$LOGDIR/rank1.log" "joined gloo group 'world' (rank 1 of 2) on 10.77.0.2" "rank 1 uses host B's address"
check "$LOGDIR/rank0.log" "worker 0: ok" "rank 0 checked every collective"
check "$LOGDIR/rank1.log" "worker 1: ok" "rank 1 checked every collective"
[ "$fail" = 0 ] && echo "PASS: two hosts joined over TcpStore at 10.77.0.1 and ran gloo over their veth addresses"
exit "$fail"
