#!/bin/bash
# Runs the shell blocks of the guides that are marked "<!-- run by: docs/guide_commands_test.sh -->"
# and checks the output blocks marked "<!-- output of: docs/guide_commands_test.sh -->".
#   guide_commands_test.sh <//pkg:target=path>...
# It reads these guides (//docs:guide_snippets_test checks that each marked block's guide is
# one of them):
GUIDES=(
  README.md
  docs/CHECKPOINTS.md
  docs/CLUSTERS.md
  docs/DATA.md
  docs/MEMORY.md
  docs/MODELS.md
  docs/POLICIES.md
  docs/STAGES.md
)
#
# A command block's lines run in order, in one working directory per guide (so a command can
# use what an earlier one wrote: out/main_job/checkpoint), with these rewrites, and nothing
# else changed:
#   bazel run [flags] //pkg:target [-- args]   the target's binary (given as //pkg:target=path)
#   bazel-bin/pkg/target                        the same binary
#   make demo [DEMO_ARGS="args"]                the main job with those args, as the Makefile runs it
#   make test, bazel build ...                  not run here (make test is what CI runs, .ci/run);
#                                               make test's recipe is checked to run every test
#   python3 tools/x.py                          that script from the test's data
#   /tmp/...                                    under the test's temporary directory
#   --max_steps=20000                           --max_steps=40 (the long run, shortened)
#   srun ... [--device=cuda]                    a stand-in srun: two local tasks with Slurm's
#                                               variables, on the CPU (no --device=cuda)
# A block whose first line starts with "$ " is one command and then what it prints. A comment
# line "# [rank ...]" or "# launch: ..." after a command, and every line of an output block
# (which belongs to the last command of the block before it), is a line the command must print:
# each number in it stands for any number, "..." for anything ("...\/" for any directory or
# none), and a run of spaces for any run of spaces (columns). A command that exits
# non-zero fails the test.
set -u
declare -A BIN
for arg in "$@"; do BIN["${arg%%=*}"]="$(realpath "${arg#*=}")"; done
RUNFILES="$(pwd)"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# The regular expression that a sample output line stands for.
pattern_of() {
  sed -E -e 's/[][\\.^$*+?(){}|/]/\\&/g' -e 's/[0-9]+(\\\.[0-9]+)?/[0-9]+(\\.[0-9]+)?/g' \
    -e 's/\\\.\\\.\\\.\\\//(.*\\\/)?/g' -e 's/\\\.\\\.\\\./.*/g' -e 's/ {2,}/ +/g' <<<"$1"
}

# Checks that `output` holds a line matching each expected line (read from stdin).
expect_lines() {
  local where="$1" output="$2" line pattern
  while IFS= read -r line; do
    [[ -z "${line// /}" ]] && continue
    pattern="$(pattern_of "$line")"
    grep -qE "^${pattern}\$" <<<"$output" || fail "$where: this line is not in the output: $line"
  done
}

# Rewrites one command of a guide into what runs here; prints it, or nothing to skip it.
rewrite() {
  local cmd="$1" target
  if [[ "$cmd" =~ ^make\ test ]]; then
    grep -qE '^\s+\$\(BAZEL\) test //\.\.\.' "$RUNFILES/Makefile" || fail "make test runs no 'bazel test //...'"
    return
  fi
  [[ "$cmd" =~ ^bazel\ build ]] && return
  if [[ "$cmd" =~ ^make\ demo\ DEMO_ARGS=\"([^\"]*)\" ]]; then
    cmd="bazel run //trainer:main_job -- ${BASH_REMATCH[1]}"
  elif [[ "$cmd" =~ ^make\ demo ]]; then
    cmd="bazel run //trainer:main_job --"
  fi
  if [[ "$cmd" =~ ^bazel\ run\ ([^/]*)(//[^ ]+)(\ --)?(.*)$ ]]; then
    target="${BASH_REMATCH[2]}"
    [[ "$target" == *:* ]] || target="$target:${target##*/}"
    [[ -n "${BIN[$target]:-}" ]] || { fail "no binary given for $target"; return; }
    cmd="${BIN[$target]}${BASH_REMATCH[4]}"
  fi
  while [[ "$cmd" =~ bazel-bin/([a-z_/]+)/([a-z_]+) ]]; do
    target="//${BASH_REMATCH[1]}:${BASH_REMATCH[2]}"
    [[ -n "${BIN[$target]:-}" ]] || { fail "no binary given for $target"; return; }
    cmd="${cmd/"${BASH_REMATCH[0]}"/${BIN[$target]}}"
  done
  cmd="${cmd//python3 tools\//python3 $RUNFILES/tools/}"
  cmd="${cmd//\/tmp\//$TMP/tmp/}"
  cmd="${cmd//--max_steps=20000/--max_steps=40}"
  if [[ "$cmd" =~ ^srun\ (.*)$ ]]; then
    cmd="export HOME=\"$work/home\" SLURM_JOB_ID=$(free_slurm_job_id); fake_srun ${BASH_REMATCH[1]// --device=cuda/}"
  fi
  printf '%s' "$cmd"
}

# A Slurm job id whose store port (comm/init_from_env.h: 10000 + id % 20000) nothing on this host
# listens on, so that runs of this test side by side do not meet on one port.
free_slurm_job_id() {
  local id
  for _ in $(seq 100); do
    id=$((RANDOM % 20000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$((10000 + id))") 2>/dev/null; then
      echo "$id"
      return
    fi
  done
  echo 4242
}

# Two tasks of one Slurm job step on this host, as srun would start them.
fake_srun() {
  local pids=() status=0 task
  for task in 0 1; do
    SLURM_PROCID=$task SLURM_LOCALID=$task SLURM_NTASKS=2 SLURM_STEP_ID=0 \
      SLURM_TASKS_PER_NODE=2 SLURM_JOB_NODELIST=localhost "$@" &
    pids+=($!)
  done
  for task in "${pids[@]}"; do wait "$task" || status=1; done
  return $status
}
export -f fake_srun

mkdir -p "$TMP/tmp"
for guide in "${GUIDES[@]}"; do
  work="$TMP/work/${guide//\//_}"
  mkdir -p "$work/checkpoint"
  ln -sfn "$RUNFILES/checkpoint/testdata" "$work/checkpoint/testdata"
  blocks=0
  last_output=""
  # Each block: a header "@@ <kind> <line>" then its lines.
  while IFS= read -r header; do
    kind="${header#@@ }"; kind="${kind%% *}"; at="${header##* }"
    body=()
    while IFS= read -r line && [[ "$line" != "@@ end" ]]; do body+=("$line"); done
    blocks=$((blocks + 1))
    where="$guide:$at"
    if [[ "$kind" == output ]]; then
      [[ -n "$last_output" ]] || { fail "$where: an output block with no command block before it"; continue; }
      expect_lines "$where" "$last_output" < <(printf '%s\n' "${body[@]}")
      continue
    fi
    # Join continued lines; split commands from expected lines.
    commands=(); expected=(); current=""
    console=0
    [[ "${body[0]:-}" == '$ '* ]] && console=1
    for line in "${body[@]}"; do
      if [[ $console == 1 ]]; then
        if [[ "$line" == '$ '* ]]; then commands+=("${line#\$ }"); expected+=(""); else expected[-1]+="$line"$'\n'; fi
        continue
      fi
      if [[ -z "$current" && "$line" =~ ^#\ (\[rank|launch:)(.*)$ ]]; then
        (( ${#expected[@]} > 0 )) && expected[-1]+="${line#\# }"$'\n'
        continue
      fi
      [[ -z "$current" && ( "$line" =~ ^# || -z "${line// /}" ) ]] && continue
      line="$(sed -E 's/[[:space:]]+#[[:space:]].*$//' <<<"$line")"
      if [[ "$line" == *'\' ]]; then current+="${line%\\} "; continue; fi
      commands+=("$(sed -E 's/[[:space:]]+/ /g' <<<"$current$line")"); expected+=(""); current=""
    done
    for i in "${!commands[@]}"; do
      run="$(rewrite "${commands[$i]}")"
      [[ -z "$run" ]] && { echo "$where: not run here: ${commands[$i]}"; continue; }
      echo "$where: running: $run"
      last_output="$(cd "$work" && timeout 300 bash -c "$run" 2>&1 </dev/null)"
      status=$?
      tail -n 40 <<<"$last_output"
      [[ $status == 0 ]] || fail "$where: exit status $status: ${commands[$i]}"
      expect_lines "$where" "$last_output" < <(printf '%s' "${expected[$i]}")
    done
  done < <(awk -v g="$guide" '
      /<!-- run by: docs\/guide_commands_test.sh -->/ { want = "run"; next }
      /<!-- output of: docs\/guide_commands_test.sh -->/ { want = "output"; next }
      /^```/ { if (inside) { if (keep) print "@@ end"; inside = 0; keep = 0 }
               else { inside = 1; if (want != "") { keep = 1; print "@@ " want " " NR }; want = "" }
               next }
      inside && keep { print }
      !inside && NF { want = want }' "$RUNFILES/$guide")
  (( blocks > 0 )) || fail "$guide: no block marked for this test"
done

if [[ "$failures" -gt 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASSED"
