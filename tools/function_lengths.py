#!/usr/bin/env python3
"""function_lengths: C++ functions longer than a limit that do not say why they are long.

    tools/function_lengths.py                  # the tracked C++ sources, limit 100 lines
    tools/function_lengths.py --limit=60 FILE...
    tools/function_lengths.py --top=20         # also list the 20 longest functions

A function is a brace-delimited body at namespace or class scope whose header (the text since
the previous ';', '{' or '}' at that scope) has a parameter list and is not a class, struct,
union, enum, namespace, extern "C" block or an initialiser (`= {`); TEST and TEST_F bodies are
functions too. Its length counts the lines from the header's first line to the closing brace.
Comments, string and character literals (raw strings included) and preprocessor lines are
blanked before braces are matched, so braces inside them do not count.

A long function passes when the comment block directly above its header, or a comment on the
first line of its body, contains "Long function:" followed by the reason.

Sources scanned without arguments: the files git tracks ending in .cc, .h, .cu or .cuh, except
under kernels/ (the device and CPU kernels, long by nature: one loop nest per function) and
third_party/. Exit status: 0 when nothing is over the limit unexplained, 1 otherwise (each
offender listed as path:line: name, N lines), 2 on bad usage.
"""

import argparse
import os
import re
import subprocess
import sys

MARKER = "Long function:"
SOURCE_SUFFIXES = (".cc", ".h", ".cu", ".cuh")
EXCLUDED_DIRS = ("kernels/", "third_party/")
NOT_FUNCTIONS = re.compile(r"^(?:template\s*<.*>\s*)?(?:class|struct|union|enum|namespace)\b"
                           r"|^extern\s+\"C")
CONTROL = re.compile(r"^(?:if|for|while|switch|catch|do|else|try)\b")


def blank_comments_and_literals(text):
    """Returns `text` with comments, literals and preprocessor lines replaced by spaces
    (newlines kept, so line numbers hold)."""
    out = []
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c == "#":
            # A preprocessor line, with its continuations.
            j = i
            while j < n and (text[j] != "\n" or text[j - 1] == "\\"):
                j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if c == "\n":
            at_line_start = True
            out.append(c)
            i += 1
            continue
        if not c.isspace():
            at_line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum()
                                                                        or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i + m.end())
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():
                # A digit separator (1'000'000), not a character literal.
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


ACCESS = re.compile(r"^\s*(?:public|private|protected)\s*:")


def is_member_initialiser(header):
    """A constructor's member initialiser written with braces (`: x_{1}`): a brace right
    after an identifier, in a ':' list that follows the parameter list."""
    h = " ".join(header.split())
    return bool(re.search(r"[A-Za-z0-9_>]$", h) and re.search(r"\)\s*(?:noexcept\s*)?:\s", h))


def is_function_header(header):
    h = " ".join(header.split())
    if not h or ")" not in h:
        return False
    if NOT_FUNCTIONS.match(h) or CONTROL.match(h):
        return False
    if re.search(r"=\s*$", h) or h.endswith("return"):
        return False
    return not is_member_initialiser(header)


def function_name(header):
    h = " ".join(header.split())
    test = re.match(r"^(TEST\w*)\s*\(([^)]*)\)", h)
    if test:
        return f"{test.group(1)}({test.group(2)})"
    m = re.search(r"([A-Za-z_~][A-Za-z0-9_:<>~]*(?:operator\S*)?)\s*\(", h)
    return m.group(1) if m else h[:40]


def find_functions(text):
    """Yields (name, first_line, last_line, body_line) for each function in `text` (1-based)."""
    code = blank_comments_and_literals(text)
    line_of = []
    line = 1
    for ch in code:
        line_of.append(line)
        if ch == "\n":
            line += 1
    # Each open scope: its kind ("ns" namespace or class scope, "fn" function, "init" a braced
    # member initialiser in a constructor's header, "other").
    stack = []
    header_start = 0  # index where the current header (at a namespace/class scope) begins
    for i, ch in enumerate(code):
        if ch not in "{};":
            continue
        in_open_scope = not stack or stack[-1][0] == "ns"
        if ch == ";":
            if in_open_scope:
                header_start = i + 1
            continue
        if ch == "{":
            if in_open_scope:
                header = code[header_start:i]
                # An access specifier ends the previous member's header.
                while ACCESS.match(header):
                    cut = ACCESS.match(header).end()
                    header_start += cut
                    header = header[cut:]
                if is_member_initialiser(header):
                    # Part of the header: the function's body follows the initialisers.
                    stack.append(("init", i, None, None))
                    continue
                if is_function_header(header):
                    first = header_start + len(header) - len(header.lstrip())
                    stack.append(("fn", i, line_of[first], header))
                else:
                    # A class, namespace, enum or initialiser opens a scope; only classes and
                    # namespaces hold functions, and an initialiser's braces hold none.
                    h = " ".join(header.split())
                    kind = "ns" if NOT_FUNCTIONS.match(h) or not h else "other"
                    if h.startswith("enum"):
                        kind = "other"
                    stack.append((kind, i, None, header))
                header_start = i + 1
            else:
                stack.append(("other", i, None, None))
            continue
        # ch == "}"
        if not stack:
            continue
        kind, open_index, first_line, header = stack.pop()
        if kind == "fn":
            yield (function_name(header), first_line, line_of[i], line_of[open_index])
        if kind != "init" and (not stack or stack[-1][0] == "ns"):
            header_start = i + 1


def explained(lines, first_line, body_line):
    """Whether the comment block above line `first_line` or body line `body_line` (1-based)
    holds the marker."""
    if MARKER in lines[body_line - 1]:
        return True
    j = first_line - 2
    while j >= 0 and lines[j].lstrip().startswith("//"):
        if MARKER in lines[j]:
            return True
        j -= 1
    return False


def tracked_sources(root):
    out = subprocess.run(["git", "-C", root, "ls-files"], check=True, capture_output=True,
                         text=True).stdout.split()
    return [os.path.join(root, p) for p in out
            if p.endswith(SOURCE_SUFFIXES) and not p.startswith(EXCLUDED_DIRS)]


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=100, help="lines a function may take")
    parser.add_argument("--top", type=int, default=0, help="also list the N longest functions")
    parser.add_argument("files", nargs="*", help="sources (default: the tracked ones)")
    args = parser.parse_args(argv)
    if args.limit < 1:
        parser.error("--limit must be at least 1")
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True, cwd=os.path.dirname(os.path.abspath(__file__)))
    files = args.files or tracked_sources(root.stdout.strip())
    found = []
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            print(f"function_lengths: cannot read {path}: {e}", file=sys.stderr)
            return 2
        lines = text.split("\n")
        for name, first, last, body in find_functions(text):
            found.append((last - first + 1, path, first, name, explained(lines, first, body)))
    base = root.stdout.strip() + "/" if root.returncode == 0 else ""
    rel = lambda p: p[len(base):] if base and p.startswith(base) else p
    if args.top:
        for length, path, first, name, why in sorted(found, reverse=True)[:args.top]:
            print(f"{length:5d}  {rel(path)}:{first}: {name}{'  (explained)' if why else ''}")
    over = sorted((f for f in found if f[0] > args.limit and not f[4]), reverse=True)
    for length, path, first, name, _ in over:
        print(f"{rel(path)}:{first}: {name}, {length} lines (limit {args.limit})")
    if over:
        print(f"function_lengths: {len(over)} function(s) over {args.limit} lines without a "
              f'comment saying why; split them, or put "{MARKER} <why>" in the comment above '
              "the function")
        return 1
    print(f"function_lengths: {len(found)} functions in {len(files)} files, none over "
          f"{args.limit} lines unexplained")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
