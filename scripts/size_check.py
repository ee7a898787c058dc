#!/usr/bin/env python3
"""Non-test Rust source files over 800 lines and functions over 150 lines (issue 47).

`scripts/size_check.py` prints every such file and function; `--check` also exits 1 when
there is any. Counted: `crates/*/src/**/*.rs` (not `tests/`, not `benches/`, not `examples/`).
A file is left out when one of its first 10 lines is a comment `// Long because: <reason>`; a
function when the comment lines and attributes right above its `fn` (doc comments included),
or the comment lines that open its body, hold `// Long because: <reason>`. The reason must not be empty.

What counts as test code: functions inside a `#[cfg(test)]` module (unit tests) are not
counted; the file's lines are, the whole file (a file is read whole, tests and all).
`outbox-testkit` is counted like any other crate, not as test code: it is a library crates'
tests share, but its suites are the cross-backend contract a newcomer reads first, so the same
limits help there; and `outbox-demo` still links it.

Function length is from the `fn` line to its closing brace, both included. Braces inside
strings, raw strings, char literals and comments are skipped.
"""
import glob
import re
import sys

FILE_LIMIT = 800
FN_LIMIT = 150
REASON = re.compile(r"//\s*Long because:\s*\S")
FN = re.compile(
    r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:default\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?"
    r"(?:extern\s+\"[^\"]*\"\s+)?fn\s+(\w+)"
)
CFG_TEST = re.compile(r"^\s*#\[cfg\((?:all\()?test\b")
MOD = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")


def code_only(text: str) -> str:
    """`text` with comments, strings and char literals blanked (newlines kept), so braces
    count."""
    out = []
    i, n = 0, len(text)
    depth = 0  # nested block comments
    while i < n:
        c = text[i]
        if depth:
            if text.startswith("*/", i):
                depth -= 1
                out.append("  ")
                i += 2
            elif text.startswith("/*", i):
                depth += 1
                out.append("  ")
                i += 2
            else:
                out.append("\n" if c == "\n" else " ")
                i += 1
            continue
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
            continue
        if text.startswith("/*", i):
            depth = 1
            out.append("  ")
            i += 2
            continue
        m = re.match(r'b?r(#*)"', text[i:]) if c in "rb" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) else None
        if m:
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append("".join("\n" if ch == "\n" else " " for ch in text[i:j]))
            i = j
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append("".join("\n" if ch == "\n" else " " for ch in text[i:j]))
            i = j
            continue
        if c == "'":
            # A char literal ('x', '\n', '\u{..}', '{'), not a lifetime ('a).
            m = re.match(r"'(?:\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:])
            if m:
                out.append(" " * m.end())
                i += m.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def block_end(code_lines: list, start: int):
    """The index of the line closing the first `{` at or after line `start`; `None` for a
    declaration without a body (`fn f();`)."""
    depth = 0
    opened = False
    for k in range(start, len(code_lines)):
        for ch in code_lines[k]:
            if ch == "{":
                depth += 1
                opened = True
            elif ch == "}":
                depth -= 1
                if opened and depth == 0:
                    return k
            elif ch == ";" and not opened and depth == 0:
                return None
    return None


def reason_at_top(lines: list, code: list, i: int) -> bool:
    """Whether the body of the fn at line `i` opens with a `// Long because:` line (the
    comment lines right after the line holding its first `{`)."""
    k = i
    while k < len(code) and "{" not in code[k]:
        k += 1
    k += 1
    while k < len(lines) and lines[k].strip().startswith("//"):
        if REASON.search(lines[k]):
            return True
        k += 1
    return False


def reason_above(lines: list, i: int) -> bool:
    k = i - 1
    while k >= 0:
        s = lines[k].strip()
        if REASON.search(s):
            return True
        if s.startswith("//") or s.startswith("#[") or s.startswith("#!["):
            k -= 1
            continue
        return False
    return False


def check_file(path: str):
    text = open(path, encoding="utf-8").read()
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    found = []
    file_reason = any(REASON.search(l) for l in lines[:10])
    if len(lines) > FILE_LIMIT and not file_reason:
        found.append(f"{path}: {len(lines)} lines (over {FILE_LIMIT})")
    code = code_only(text).split("\n")
    # Line ranges of `#[cfg(test)] mod … { … }`.
    test_ranges = []
    for i, l in enumerate(lines):
        if CFG_TEST.match(l):
            k = i + 1
            while k < len(lines) and lines[k].strip().startswith(("#[", "//")):
                k += 1
            if k < len(lines) and MOD.match(lines[k]):
                end = block_end(code, k)
                if end is not None:
                    test_ranges.append((k, end))
    for i, l in enumerate(lines):
        m = FN.match(code[i]) if i < len(code) else None
        if not m:
            continue
        if any(a <= i <= b for a, b in test_ranges):
            continue
        end = block_end(code, i)
        if end is None:
            continue
        length = end - i + 1
        if length > FN_LIMIT and not (reason_above(lines, i) or reason_at_top(lines, code, i)):
            found.append(f"{path}:{i + 1}: fn {m.group(1)} is {length} lines (over {FN_LIMIT})")
    return found


def main() -> int:
    check = "--check" in sys.argv[1:]
    found = []
    for path in sorted(glob.glob("crates/*/src/**/*.rs", recursive=True)):
        found.extend(check_file(path))
    for f in found:
        print(f)
    if found:
        print(
            f"{len(found)} over the limits: split them, or put `// Long because: <reason>` "
            "atop the file, or above the fn or atop its body",
            file=sys.stderr,
        )
    return 1 if check and found else 0


if __name__ == "__main__":
    sys.exit(main())
