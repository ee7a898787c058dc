#!/usr/bin/env python3
"""Counts SQL statements written inline in the store and inbox crates' source, outside
`queries/*.sql` and `migrations/`, where issue 47 wants none: every statement has a name and a
file (docs/sql-contract.md section 10 lists the placeholders they take).

A string literal (plain or raw) counts as a statement when it starts, after blanks, with an SQL
statement keyword in capitals and at least one more word. Tests (`tests/`, `benches/`, and a
file's `#[cfg(test)]` modules) are left out; so are the literals of EXCEPTIONS, each with the
reason it is not a statement the crate runs.

    scripts/inline_sql.py          list what it finds
    scripts/inline_sql.py --check  the same, exit 1 when anything is found
"""

import re
import sys
from pathlib import Path

CRATES = ["outbox-postgres", "outbox-mysql", "outbox-sqlite", "outbox-inbox"]
KEYWORDS = (
    "SELECT INSERT UPDATE DELETE CREATE DROP ALTER WITH BEGIN COMMIT ROLLBACK LOCK GRANT REVOKE "
    "TRUNCATE CALL XA SHOW SET START SAVEPOINT RELEASE ANALYZE VACUUM PRAGMA LISTEN NOTIFY DO "
    "REPLACE RENAME FLUSH KILL USE EXPLAIN PREPARE EXECUTE DEALLOCATE"
).split()
STATEMENT = re.compile(r"^\s*(%s)\s+\S" % "|".join(KEYWORDS))
# A plain literal (escapes allowed) or a raw one, r"..." / r#"..."# (any number of #).
LITERAL = re.compile(r'r(#*)"(.*?)"\1|"((?:[^"\\]|\\.)*)"', re.S)

# (file, literal's first line): why it is not a statement the crate runs.
EXCEPTIONS = {
    ("outbox-mysql/src/binlog/xa.rs", "XA COMMIT "): "parses a binlog event's query text",
    ("outbox-mysql/src/binlog/xa.rs", "XA ROLLBACK "): "parses a binlog event's query text",
    ("outbox-inbox/src/redis_dedupe.rs", "SET NX"): "names a Redis command in an error",
    ("outbox-postgres/src/store/mod.rs", "LISTEN on the outbox"): "an error's context, not SQL",
}


def without_tests(text: str) -> str:
    """The file's text up to its first `#[cfg(test)]` item (test modules sit at the end)."""
    m = re.search(r"^\s*#\[cfg\(test\)\]\s*\n\s*mod\s", text, re.M)
    return text[: m.start()] if m else text


def comments_blanked(text: str) -> str:
    """Line comments replaced by blanks, so a quote in a comment opens no literal."""
    out = []
    for line in text.split("\n"):
        # A `//` outside a literal: good enough for this tree (no `"//"` in SQL-bearing lines).
        in_str = False
        cut = len(line)
        i = 0
        while i < len(line) - 1:
            c = line[i]
            if c == "\\" and in_str:
                i += 2
                continue
            if c == '"':
                in_str = not in_str
            elif not in_str and line[i : i + 2] == "//":
                cut = i
                break
            i += 1
        out.append(line[:cut])
    return "\n".join(out)


def find(root: Path) -> list[tuple[str, int, str]]:
    found = []
    for crate in CRATES:
        for path in sorted((root / "crates" / crate / "src").rglob("*.rs")):
            rel = str(path.relative_to(root / "crates"))
            text = comments_blanked(without_tests(path.read_text()))
            for m in LITERAL.finditer(text):
                body = m.group(2) if m.group(2) is not None else m.group(3)
                if not STATEMENT.match(body):
                    continue
                first = body.strip().split("\n")[0]
                if any(rel == f and first.startswith(lit.strip()) for f, lit in EXCEPTIONS):
                    continue
                line = text.count("\n", 0, m.start()) + 1
                found.append((rel, line, first[:80]))
    return found


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    found = find(root)
    for rel, line, first in found:
        print(f"crates/{rel}:{line}: {first}")
    print(f"inline SQL statements in {', '.join(CRATES)} (tests and the "
          f"{len(EXCEPTIONS)} named exceptions left out): {len(found)}")
    return 1 if found and "--check" in sys.argv else 0


if __name__ == "__main__":
    sys.exit(main())
