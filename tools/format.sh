#!/usr/bin/env bash
# format.sh: the C++ formatting check of `make test`, and the command that fixes what it finds.
#
#   tools/format.sh                # check every tracked C++ source; lists the unformatted ones
#   tools/format.sh --fix          # format them in place
#   tools/format.sh [--fix] FILE...
#
# The style is .clang-format's (Google, 100 columns), applied by Debian 12's clang-format 14
# (tools/setup.sh installs clang-format-14): other versions break lines differently, so the
# check refuses them rather than report a tree formatted by 14 as wrong. $CLANG_FORMAT names
# another binary of version 14. Sources: the files git tracks ending in .cc, .h, .cu or .cuh,
# except under third_party/.
# Exit status: 0 when every file is formatted (or, with --fix, after formatting), 1 when some
# are not, 2 when no clang-format 14 is found or on bad usage.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

fix=0
files=()
for a in "$@"; do
  case "$a" in
    --fix) fix=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "format.sh: unknown option '$a' (use --fix, or name files)" >&2; exit 2 ;;
    *) files+=("$a") ;;
  esac
done

find_clang_format() {
  local c
  for c in "${CLANG_FORMAT:-}" clang-format-14 clang-format; do
    [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 || continue
    if "$c" --version 2>/dev/null | grep -qE 'version 14\.'; then echo "$c"; return 0; fi
  done
  return 1
}
if ! CF=$(find_clang_format); then
  found=$(command -v clang-format >/dev/null 2>&1 && clang-format --version | head -1)
  echo "format.sh: no clang-format 14 found${found:+ (clang-format on PATH is: $found)};" \
    "run tools/setup.sh (installs Debian's clang-format-14) or set CLANG_FORMAT" >&2
  exit 2
fi

if [ ${#files[@]} -eq 0 ]; then
  mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | grep -v '^third_party/')
fi

if [ "$fix" = 1 ]; then
  printf '%s\0' "${files[@]}" | xargs -0 -n 50 "$CF" -i --style=file || exit 1
  echo "format.sh: formatted ${#files[@]} files with $($CF --version | head -1)"
  exit 0
fi

for f in "${files[@]}"; do
  [ -f "$f" ] || { echo "format.sh: $f: no such file" >&2; exit 2; }
done
# Two clang-format processes at a time; each prints the files it would change.
mapfile -t unformatted < <(printf '%s\0' "${files[@]}" | CF=$CF xargs -0 -n 20 -P 2 sh -c \
  'for f; do "$CF" --style=file "$f" | cmp -s - "$f" || echo "$f"; done' sh | sort)
if [ ${#unformatted[@]} -gt 0 ]; then
  echo "format.sh: ${#unformatted[@]} of ${#files[@]} C++ files are not formatted (.clang-format):"
  printf '  %s\n' "${unformatted[@]:0:20}"
  [ ${#unformatted[@]} -gt 20 ] && echo "  ... and $((${#unformatted[@]} - 20)) more"
  if [ ${#unformatted[@]} -le 10 ]; then
    echo "format.sh: fix them with: tools/format.sh --fix ${unformatted[*]}"
  else
    echo "format.sh: fix them with: tools/format.sh --fix"
  fi
  exit 1
fi
echo "format.sh: all ${#files[@]} C++ files formatted"
