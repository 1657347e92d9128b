#!/bin/bash
# The direction of the dependencies between integration and trainer (docs/DESIGN.md,
# "Packages (Bazel), and which way dependencies point"): trainer, the application, depends
# on integration, the library's stage API, never the reverse. Each argument is a BUILD file
# of a package under integration/; none may name a //trainer target. (trainer's libraries
# are visible only inside trainer/, so such a dependency would not build either; this test
# also catches the public //trainer:main_job binary as a data dependency, and says why.)
set -u
fail=0
[ "$#" -gt 0 ] || { echo "layering_test: no BUILD files given"; exit 1; }
for build in "$@"; do
  [ -f "$build" ] || { echo "layering_test: $build is missing"; fail=1; continue; }
  if hits=$(grep -nE '(^|[^A-Za-z0-9_])//trainer([:/"]|$)' "$build"); then
    echo "FAIL: $build depends on //trainer (integration must not depend on the application):"
    echo "$hits"
    fail=1
  else
    echo "ok: $build names no //trainer target"
  fi
done
exit "$fail"
