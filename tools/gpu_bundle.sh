#!/usr/bin/env bash
# gpu_bundle.sh: builds, here, everything the GPU acceptance run needs and packs it into one
# archive for a GPU machine that has a driver, the CUDA libraries and PyTorch but no Bazel,
# no Debian packages and no network (tools/gpu_bundle/run.py says what runs there).
#
#   tools/gpu_bundle.sh                  # build with --config=cuda -c opt, pack, then --check
#   tools/gpu_bundle.sh --no-build       # pack what the last build left (same flags)
#   tools/gpu_bundle.sh --check          # verify out/gpu_bundle.tar.xz here (no build)
#   tools/gpu_bundle.sh --out=/tmp/b.tar.xz
#
# The archive (default out/gpu_bundle.tar.xz, at most 60 MiB; the size is printed) holds one
# directory gpu_bundle/ with
#   run.sh                    the acceptance run's entry point (tools/gpu_bundle/run.sh)
#   run.py, gpu_run/*.py      the run itself (tools/gpu_bundle/run.py and its package)
#   bin/main_job, bin/collectives_bench, bin/attention_bench, bin/tests/<package>.<name>
#                             (every test tagged gpu, found with bazel query; <name>.runfiles
#                             beside a test with data)
#   bench/pytorch_fsdp2.py    the PyTorch FSDP2 side of the comparison
#   bench/attention_torch.py  PyTorch SDPA beside bin/attention_bench (our fused attention)
#   lib/                      the Debian shared libraries the binaries load (from ldd), not
#                             glibc's and not the CUDA/NCCL/driver libraries, which come from
#                             the GPU machine; lib/compat/ libstdc++ and libgcc_s, which
#                             run.sh uses only where the machine's are older;
#                             lib/cuda_sonames.txt the CUDA libraries run.sh must find there
#   MANIFEST.txt              commit, build flags, glibc versions needed, file sizes
# The binaries link our code statically (--dynamic_mode=off), so nothing from bazel-bin's
# _solib is needed. The build goes to bazel-out/k8-opt (shared with -c opt CPU builds, whose
# outputs the disk cache keeps) and creates no bazel-* links, so `make test` is undisturbed.
#
# --check extracts the archive to a temporary directory and fails unless: it is at most the
# size limit; it holds run.sh, run.py and gpu_run/, the two scripts, main_job,
# collectives_bench, attention_bench and lib/; the Python files compile; every library each
# binary loads resolves (LD_LIBRARY_PATH=lib:/usr/local/cuda/lib64) into the bundle's lib/,
# glibc, or the CUDA libraries; each test lists its tests (--gtest_list_tests), main_job
# prints its --help, collectives_bench runs one tiny gloo all_reduce, attention_bench prints
# its JSON line (on a machine without a GPU: the CUDA runtime's error, which shows that it
# starts and reaches the driver); run.sh (--call=all, every phase left out) finds the CUDA libraries of this machine
# and prints a JSON line. So a missing library shows up here, not on the GPU machine.
#
# On a GPU machine lent through the device tool (only the checkout travels, plus ignored
# paths named in carry, 64 MiB in all; out/ is ignored), in two calls
# (tools/gpu_bundle/README.md says what each runs and why):
#   run(command="tar xJf out/gpu_bundle.tar.xz -C /tmp && /tmp/gpu_bundle/run.sh --call=1",
#       carry=["out/gpu_bundle.tar.xz"], timeout_s=360)
#   run(command="tar xJf out/gpu_bundle.tar.xz -C /tmp && /tmp/gpu_bundle/run.sh --call=2",
#       carry=["out/gpu_bundle.tar.xz"], timeout_s=480)
# run.sh copies its JSON summary and logs to $OUT, which the device tool brings back.
#
# Exit status: 0 on success, 1 on a failed build/pack/check, 2 on bad usage or when nvcc
# is missing for a build.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
ROOT=$PWD
BAZEL=${BAZEL:-bazel}
ARCHIVE=out/gpu_bundle.tar.xz
MAX_MIB=${GPU_BUNDLE_MAX_MIB:-60}
NVCC=/usr/local/cuda/bin/nvcc
CUDA_LIB=/usr/local/cuda/lib64
FLAGS=(--config=cuda -c opt --dynamic_mode=off)
# run.py's package (tools/gpu_bundle/gpu_run): each of its files is packed and checked.
mapfile -t RUN_PY_MODULES < <(cd tools/gpu_bundle/gpu_run && ls -- *.py)
MODE=build
for a in "$@"; do
  case "$a" in
    --check) MODE=check ;;
    --no-build) MODE=pack ;;
    --out=*) ARCHIVE=${a#--out=} ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_bundle: unknown argument '$a' (use --check, --no-build, --out=PATH)" >&2; exit 2 ;;
  esac
done
case "$ARCHIVE" in /*) ;; *) ARCHIVE=$ROOT/$ARCHIVE ;; esac

say() { echo "gpu_bundle: $*"; }
die() { echo "gpu_bundle: FAILED: $*" >&2; exit 1; }

# Libraries that come from the GPU machine or are glibc: by soname (and by path for CUDA).
is_glibc() {
  case "$1" in
    linux-vdso.so.*|ld-linux*.so.*|libc.so.6|libm.so.6|libpthread.so.0|libdl.so.2|librt.so.1|\
    libresolv.so.2|libutil.so.1|libanl.so.1|libnsl.so.1|libmvec.so.1) return 0 ;;
  esac
  return 1
}
is_cuda() {  # is_cuda <soname> <path>
  case "$1" in
    libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libnccl.so*|libnvidia-*|\
    libnvrtc*|libnvJitLink*|libcudnn*|libcufft*|libcurand*|libcusolver*|libcusparse*|libcupti*) return 0 ;;
  esac
  case "$2" in /usr/local/cuda*) return 0 ;; esac
  return 1
}
is_elf() { [ "$(head -c 4 "$1" 2>/dev/null | od -An -c | tr -d ' ')" = '177ELF' ]; }

# ---- check ------------------------------------------------------------------------------
check() {
  local archive=$1 bytes tmp x failed=0
  [ -f "$archive" ] || die "no archive at $archive (build it with tools/gpu_bundle.sh)"
  bytes=$(stat -c %s "$archive")
  say "check $archive: $bytes bytes ($(awk -v b="$bytes" 'BEGIN{printf "%.1f", b/1048576}') MiB, limit $MAX_MIB MiB)"
  [ "$bytes" -le $((MAX_MIB << 20)) ] || { say "FAIL: larger than $MAX_MIB MiB"; failed=1; }
  tmp=$(mktemp -d /tmp/gpu_bundle_check.XXXXXX)
  trap 'rm -rf "$tmp"' RETURN
  tar -xJf "$archive" -C "$tmp" || die "cannot extract $archive"
  x=$tmp/gpu_bundle
  say "contents: $(find "$x" -type f | wc -l) files, $(du -sm "$x" | cut -f1) MiB unpacked:"
  (cd "$x" && find . -path ./lib -prune -o -type f -printf '  %p %s\n' | sort)
  say "  lib/: $(find "$x/lib" -type f | wc -l) files, $(du -sm "$x/lib" | cut -f1) MiB"
  for f in run.sh run.py "${RUN_PY_MODULES[@]/#/gpu_run/}" bench/pytorch_fsdp2.py \
      bench/attention_torch.py bin/main_job bin/collectives_bench bin/attention_bench \
      lib/cuda_sonames.txt MANIFEST.txt; do
    [ -s "$x/$f" ] || { say "FAIL: $f is missing"; failed=1; }
  done
  [ -x "$x/run.sh" ] || { say "FAIL: run.sh is not executable"; failed=1; }
  bash -n "$x/run.sh" || { say "FAIL: run.sh: syntax"; failed=1; }
  local py
  for py in "$x/run.py" "$x"/gpu_run/*.py "$x/bench/pytorch_fsdp2.py" "$x/bench/attention_torch.py"; do
    # compile() rather than py_compile: nothing written into the extracted bundle.
    python3 -c 'import sys; compile(open(sys.argv[1]).read(), sys.argv[1], "exec")' "$py" ||
      { say "FAIL: ${py#"$x/"} does not compile"; failed=1; }
  done
  local ntests
  ntests=$(find "$x/bin/tests" -maxdepth 1 -type f 2>/dev/null | wc -l)
  say "gpu test binaries: $ntests"
  [ "$ntests" -ge 1 ] || { say "FAIL: no gpu test binaries"; failed=1; }

  local ld="$x/lib:$CUDA_LIB" b name out lib path bad
  while IFS= read -r b; do
    is_elf "$b" || continue
    name=${b#"$x/"}
    out=$(LD_LIBRARY_PATH=$ld ldd "$b" 2>&1)
    bad=""
    while read -r lib _ path _; do
      [ -n "$lib" ] || continue
      case "$path" in
        "$x"/lib/*) continue ;;
        not) bad="$bad $lib(not found)"; continue ;;
      esac
      is_glibc "$lib" && continue
      is_cuda "$lib" "$path" && continue
      [ -f "$x/lib/compat/$lib" ] && continue  # run.sh adds lib/compat where it is needed
      bad="$bad $lib($path)"
    done < <(grep '=>' <<<"$out")
    if [ -n "$bad" ]; then
      say "FAIL: $name loads libraries that are not in the bundle (missing on the GPU machine):$bad"
      failed=1
    fi
  done < <(find "$x/bin" -type f | sort)

  for b in "$x"/bin/tests/*; do
    [ -f "$b" ] || continue
    if out=$(LD_LIBRARY_PATH=$ld timeout 60 "$b" --gtest_list_tests 2>&1); then
      say "ok: $(basename "$b") lists $(grep -c '^  ' <<<"$out") tests"
    else
      say "FAIL: $(basename "$b") --gtest_list_tests: $(tail -3 <<<"$out")"
      failed=1
    fi
  done
  out=$(LD_LIBRARY_PATH=$ld timeout 60 "$x/bin/main_job" --help 2>&1)
  if grep -q "error while loading shared libraries" <<<"$out" || ! grep -q -- "--device" <<<"$out"; then
    say "FAIL: main_job --help: $(tail -3 <<<"$out")"
    failed=1
  else
    say "ok: main_job --help ($(grep -c -- ' --' <<<"$out") flag lines)"
  fi
  if out=$(LD_LIBRARY_PATH=$ld timeout 120 "$x/bin/collectives_bench" --backend=gloo --nproc=1 \
      --min_bytes=4096 --max_bytes=4096 --ops=all_reduce 2>&1) && grep -q '"results"' <<<"$out"; then
    say "ok: collectives_bench ran a gloo all_reduce"
  else
    say "FAIL: collectives_bench: $(tail -3 <<<"$out")"
    failed=1
  fi
  # Its JSON line comes last whether or not this machine has a GPU (then: ok false, the CUDA
  # runtime's error, exit 1); a tiny problem in case it has one.
  out=$(LD_LIBRARY_PATH=$ld timeout 120 "$x/bin/attention_bench" --batch=1 --seq_len=64 --reps=1 \
    --warmup=0 2>/dev/null)
  if tail -1 <<<"$out" | python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
print("gpu_bundle: attention_bench: " + ("ran" if j["ok"] else "ok false: " + str(j["error"])))
sys.exit(0 if j["attention_bench"] == 1 and "built without CUDA" not in str(j["error"]) else 1)'; then
    say "ok: attention_bench prints its JSON line"
  else
    say "FAIL: attention_bench: $(tail -3 <<<"$out")"
    failed=1
  fi
  # run.sh's library discovery on this machine (no GPU: every phase left out).
  out=$(SKIP=ours,pytorch,attention,tests,bench,llama,offload,ncu RUN_WORK=$tmp/run \
    "$x/run.sh" --call=all 2>&1)
  if tail -1 <<<"$out" | python3 -c '
import json, sys
s = json.loads(sys.stdin.read())
missing = [k for k, v in s["env"]["libraries"].items() if not v]
print("gpu_bundle: run.sh found " + ", ".join(f"{k} in {v}" for k, v in s["env"]["libraries"].items()))
sys.exit(1 if missing or not s["env"]["libraries"] else 0)'; then
    say "ok: run.sh finds the CUDA libraries here and prints its JSON"
  else
    say "FAIL: run.sh (discovery only): $(tail -3 <<<"$out")"
    failed=1
  fi
  grep -E '^(needs|commit)' "$x/MANIFEST.txt" | sed 's/^/gpu_bundle: /'
  if [ $failed = 0 ]; then say "check PASSED"; else say "check FAILED"; fi
  return $failed
}

if [ "$MODE" = check ]; then
  check "$ARCHIVE"
  exit $?
fi

# ---- build ------------------------------------------------------------------------------
[ -x "$NVCC" ] || { echo "gpu_bundle: $NVCC not found: the CUDA build needs the toolkit" >&2; exit 2; }
start=$(date +%s)
# Tests tagged exactly "gpu" (not e.g. "nogpu"); tests(//...) leaves out manual ones.
TESTS=$("$BAZEL" query 'attr(tags, "(^|[ ,\[])gpu([],]|$)", tests(//...))' 2>/dev/null | sort) ||
  die "bazel query for the gpu tests"
say "gpu tests: $(echo $TESTS)"
TEST_LIST=()
[ -n "$TESTS" ] && mapfile -t TEST_LIST <<<"$TESTS"
TARGETS=(//trainer:main_job //bench:collectives_bench //bench:attention_bench "${TEST_LIST[@]}")
if [ "$MODE" = build ]; then
  say "bazel build ${FLAGS[*]} (${#TARGETS[@]} targets)"
  "$BAZEL" build "${FLAGS[@]}" --symlink_prefix=/ "${TARGETS[@]}" 2>&1 | tail -n 5
  [ "${PIPESTATUS[0]}" = 0 ] || die "bazel build ${FLAGS[*]}"
fi
BIN=$("$BAZEL" info "${FLAGS[@]}" bazel-bin 2>/dev/null) || die "bazel info bazel-bin"

# ---- pack -------------------------------------------------------------------------------
STAGE=$ROOT/out/gpu_bundle_stage
X=$STAGE/gpu_bundle
rm -rf "$STAGE"
mkdir -p "$X/bin/tests" "$X/lib/compat" "$X/bench" || die "mkdir $X"
cp "$BIN/trainer/main_job" "$BIN/bench/collectives_bench" "$BIN/bench/attention_bench" "$X/bin/" ||
  die "copy binaries from $BIN"
for t in $TESTS; do
  pkg=${t#//}
  pkg=${pkg%%:*}
  name=${t##*:}
  flat="${pkg//\//.}.$name"
  cp "$BIN/$pkg/$name" "$X/bin/tests/$flat" || die "copy $t from $BIN/$pkg/$name"
  rf="$BIN/$pkg/$name.runfiles"
  # Its runfiles only when it has data beside itself.
  if [ -d "$rf" ] && find -L "$rf" -type f ! -name MANIFEST ! -name _repo_mapping \
      ! -path "*/$pkg/$name" | grep -q .; then
    cp -rL "$rf" "$X/bin/tests/$flat.runfiles" || die "copy the runfiles of $t"
  fi
done
chmod -R u+w "$X/bin"
mkdir -p "$X/gpu_run" || die "mkdir $X/gpu_run"
cp tools/gpu_bundle/run.sh tools/gpu_bundle/run.py "$X/" && chmod +x "$X/run.sh" "$X/run.py" ||
  die "copy run.sh and run.py"
cp "${RUN_PY_MODULES[@]/#/tools/gpu_bundle/gpu_run/}" "$X/gpu_run/" || die "copy gpu_run/"
cp bench/pytorch_fsdp2.py bench/attention_torch.py "$X/bench/" || die "copy the bench/ scripts"

declare -A SEEN=()
: >"$X/lib/cuda_sonames.txt"
while IFS= read -r b; do
  is_elf "$b" || continue
  while read -r lib _ path _; do
    [ -n "$lib" ] && [ -z "${SEEN[$lib]:-}" ] || continue
    SEEN[$lib]=1
    [ "$path" = not ] && die "$b: $lib not found here"
    is_glibc "$lib" && continue
    if is_cuda "$lib" "$path"; then
      echo "$lib" >>"$X/lib/cuda_sonames.txt"
    elif [ "$lib" = libstdc++.so.6 ] || [ "$lib" = libgcc_s.so.1 ]; then
      cp -L "$path" "$X/lib/compat/$lib" || die "copy $path"
    else
      cp -L "$path" "$X/lib/$lib" || die "copy $path"
    fi
  done < <(ldd "$b" | grep '=>')
done < <(find "$X/bin" -type f | sort)
sort -o "$X/lib/cuda_sonames.txt" "$X/lib/cuda_sonames.txt"

# The newest glibc symbol versions the binaries and lib/ need, and lib/compat.
max_version() {  # max_version <prefix> <files...>
  local prefix=$1
  shift
  objdump -T "$@" 2>/dev/null | grep -o "${prefix}_[0-9][0-9.]*" | sort -uV | tail -1
}
mapfile -t MAIN_FILES < <(find "$X/bin" "$X/lib" -maxdepth 2 -type f ! -path '*/compat/*' ! -name '*.txt' ! -name MANIFEST)
glibc_needed=$(max_version GLIBC "${MAIN_FILES[@]}")
glibcxx_needed=$(max_version GLIBCXX "${MAIN_FILES[@]}")
glibc_compat=$(max_version GLIBC "$X"/lib/compat/*)
{
  echo "gpu_bundle commit $(git rev-parse --short=12 HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo -dirty)" \
    "built $(date -u +%Y-%m-%dT%H:%MZ) with bazel build ${FLAGS[*]}"
  echo "commit $(git rev-parse HEAD 2>/dev/null)"
  echo "needs glibc >= ${glibc_needed#GLIBC_} (built on $(ldd --version | head -1 | awk '{print $NF}'); lib/compat, used only where the machine's libstdc++ lacks ${glibcxx_needed:-nothing}, needs ${glibc_compat#GLIBC_}), CUDA libraries: $(tr '\n' ' ' <"$X/lib/cuda_sonames.txt")"
  echo "gpu tests: $(echo $TESTS)"
  echo "files:"
  (cd "$X" && find . -type f -printf '%p %s\n' | sort)
} >"$X/MANIFEST.txt"

mkdir -p "$(dirname "$ARCHIVE")"
say "packing $(du -sm "$X" | cut -f1) MiB with xz -9"
tar -C "$STAGE" --owner=0 --group=0 -cf - gpu_bundle | xz -9 -T1 >"$ARCHIVE.tmp" || die "tar | xz"
mv "$ARCHIVE.tmp" "$ARCHIVE"
rm -rf "$STAGE"
bytes=$(stat -c %s "$ARCHIVE")
say "wrote $ARCHIVE: $bytes bytes ($(awk -v b="$bytes" 'BEGIN{printf "%.1f", b/1048576}') MiB) in $(($(date +%s) - start)) s"
check "$ARCHIVE"
