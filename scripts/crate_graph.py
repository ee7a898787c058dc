#!/usr/bin/env python3
"""The workspace's crate graph as a Mermaid flowchart, from `cargo metadata`.

`scripts/crate_graph.py` prints it; `scripts/crate_graph.py --check docs/architecture.md`
fails (exit 1, with the difference) unless the block between the markers
`<!-- crate-graph:begin -->` and `<!-- crate-graph:end -->` in that file is exactly what it
prints, so the picture in the architecture page always matches the crates. Only normal
dependencies between workspace crates count (dev-dependencies are tests' business); an edge
implied by another path is kept, since each is a real `[dependencies]` line.

`--check` also holds two rules of docs/architecture.md (issue 47), from the same metadata:
only outbox-db (and the backend crates, and the test kit, which no shipped crate links) has
a backend crate (outbox-postgres, outbox-mysql, outbox-sqlite) as a normal dependency, so
every other crate reaches a database through outbox-db (dev-dependencies are fine); and
outbox-testkit is not among the crates the `outbox` binary links.
"""
import json
import subprocess
import sys

BEGIN, END = "<!-- crate-graph:begin -->", "<!-- crate-graph:end -->"
# The backend crates: only outbox-db reaches them (see `rules`).
BACKENDS = {"outbox-postgres", "outbox-mysql", "outbox-sqlite"}
# Crates that may depend on a backend crate: outbox-db, the backends, and the test kit (test
# support: a dev-dependency only, which the second rule checks for the binary).
MAY_NAME_BACKENDS = {"outbox-db", "outbox-testkit"} | BACKENDS
# Crates still naming a backend crate, each with the work that removes it: reported, not
# failed, until that work lands (then its line goes).
PENDING: dict[str, str] = {}
# The package building the `outbox` binary, and the crate it must not link.
BINARY_PACKAGE, TEST_KIT = "outbox-cli", "outbox-testkit"


def metadata() -> dict:
    return json.loads(
        subprocess.run(
            ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )


def normal_deps(meta: dict) -> dict:
    """Each workspace crate's normal dependencies on workspace crates."""
    members = {p["name"] for p in meta["packages"]}
    return {
        p["name"]: sorted(
            {
                d["name"]
                for d in p["dependencies"]
                if d["name"] in members and d.get("kind") is None
            }
        )
        for p in meta["packages"]
    }


def rules(deps: dict) -> list:
    """What breaks the rules above, one line each (empty: they hold)."""
    broken = [
        f"{crate} has {b} as a normal dependency: reach the database through outbox-db "
        "(a dev-dependency is fine)"
        for crate, ds in sorted(deps.items())
        if crate not in MAY_NAME_BACKENDS and crate not in PENDING
        for b in ds
        if b in BACKENDS
    ]
    linked, todo = set(), [BINARY_PACKAGE]
    while todo:
        crate = todo.pop()
        if crate not in linked:
            linked.add(crate)
            todo.extend(deps.get(crate, []))
    if TEST_KIT in linked:
        broken.append(
            f"the `outbox` binary ({BINARY_PACKAGE}) links {TEST_KIT} through a normal "
            "dependency: make it a dev-dependency"
        )
    return broken


def graph(deps: dict) -> str:
    lines = ["```mermaid", "flowchart TD"]
    for name in sorted(deps):
        ds = deps[name]
        if ds:
            lines.append(f"    {name} --> {' & '.join(ds)}")
        else:
            lines.append(f"    {name}")
    lines.append("```")
    return "\n".join(lines)


def main() -> int:
    deps = normal_deps(metadata())
    g = graph(deps)
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        broken = rules(deps)
        for line in broken:
            print(f"crate rule broken: {line}", file=sys.stderr)
        for crate, why in PENDING.items():
            if any(d in BACKENDS for d in deps.get(crate, [])):
                print(f"crate rule pending: {crate} still names a backend crate ({why})")
            else:
                print(f"{crate} names no backend crate any more: remove it from PENDING",
                      file=sys.stderr)
                broken.append(crate)
        text = open(sys.argv[2], encoding="utf-8").read()
        try:
            block = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
        except IndexError:
            print(f"{sys.argv[2]}: no {BEGIN} … {END} block", file=sys.stderr)
            return 1
        if block != g:
            print(
                f"{sys.argv[2]}: the crate graph differs from the crates; replace the block "
                f"with the output of scripts/crate_graph.py:\n{g}",
                file=sys.stderr,
            )
            return 1
        if broken:
            return 1
        print(f"{sys.argv[2]}: the crate graph matches the crates, and the crate rules hold")
        return 0
    print(g)
    return 0


if __name__ == "__main__":
    sys.exit(main())
