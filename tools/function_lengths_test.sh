#!/bin/bash
# tools/function_lengths.py on sources written here: what counts as a function, how its
# lines are counted, what the braces of comments, literals and initialisers do, and the
# "Long function:" comment that lets a long one pass.
set -u
SCRIPT=$1
T=${TEST_TMPDIR:-$(mktemp -d)}
fail=0
check() {  # check <what> <command...>
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; fi
}
body() {  # body <n>: n lines of statements
  local i; for ((i = 0; i < $1; i++)); do echo "  x += $i;"; done
}

{
  echo "namespace a {"
  echo "namespace {"
  echo "// Sums."
  echo "int Long(int x) {"          # 51 lines: the header, 48, the return, the brace
  body 48
  echo "  return x;"
  echo "}"
  echo "}  // namespace"
  echo "// Long function: one case per opcode; split, the table would scatter."
  echo "int Explained(int x) {"
  body 60
  echo "  return x;"
  echo "}"
  echo "class C {"
  echo " public:"
  echo "  int Member(int x) const {"
  echo '    const char* s = "}}}{{ not a brace";'
  echo "    char c = '}';"
  echo "    // } neither is this"
  echo "    /* { nor"
  echo "       this } */"
  echo '    const char* raw = R"json({"a": {"b": }})json";'
  echo "    auto f = [&](int y) { return y + 1; };"
  echo "    if (x > 1'000) { x = f(x); }"
  body 40
  echo "    return x;"
  echo "  }"
  echo "};"
  echo "C::C(int v) : v_{v}, w_(v) {"
  body 55
  echo "}"
  echo "struct Table { int a; } kTable = {1};"
  echo "int Short() { return 1; }"
  echo "TEST(Suite, Name) {"
  body 70
  echo "}"
  echo "}  // namespace a"
} >"$T/sample.cc"

out=$(python3 "$SCRIPT" --limit=50 "$T/sample.cc"); rc=$?
echo "$out"
check "exit status 1 when a function is over the limit" [ "$rc" = 1 ]
check "a namespace-scope function over the limit is listed with its line and length" \
  grep -q "sample.cc:4: Long, 51 lines (limit 50)" <<<"$out"
check "a function whose comment says why it is long is not listed" \
  bash -c '! grep -q "Explained" <<<"$1"' _ "$out"
check "a member function is counted from its header to its brace, literals and comments aside" \
  grep -qE "sample.cc:[0-9]+: Member, 51 lines" <<<"$out"
check "a constructor's braced member initialiser does not end the function" \
  grep -qE "sample.cc:[0-9]+: C::C, 57 lines" <<<"$out"
check "a TEST body is a function" grep -qE "sample.cc:[0-9]+: TEST\(Suite, Name\), 72 lines" <<<"$out"
check "short functions and initialisers are not listed" \
  bash -c '! grep -qE "Short|Table|kTable" <<<"$1"' _ "$out"

out=$(python3 "$SCRIPT" --limit=100 "$T/sample.cc"); rc=$?
check "under a limit none reach, exit status 0" [ "$rc" = 0 ]
check "...and it says how many functions it saw" grep -q "function_lengths: 6 functions in 1 files" <<<"$out"

python3 "$SCRIPT" --limit=0 "$T/sample.cc" >/dev/null 2>&1
check "a limit below 1 is bad usage (exit status 2)" [ "$?" = 2 ]
exit "$fail"
