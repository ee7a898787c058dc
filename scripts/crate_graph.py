#!/usr/bin/env python3
"""The workspace's crate graph as a Mermaid flowchart, from `cargo metadata`.

`scripts/crate_graph.py` prints it; `scripts/crate_graph.py --check docs/architecture.md`
fails (exit 1, with the difference) unless the block between the markers
`<!-- crate-graph:begin -->` and `<!-- crate-graph:end -->` in that file is exactly what it
prints, so the picture in the architecture page always matches the crates. Only normal
dependencies between workspace crates count (dev-dependencies are tests' business); an edge
implied by another path is kept, since each is a real `[dependencies]` line.
"""
import json
import subprocess
import sys

BEGIN, END = "<!-- crate-graph:begin -->", "<!-- crate-graph:end -->"


def graph() -> str:
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    members = {p["name"] for p in meta["packages"]}
    lines = ["```mermaid", "flowchart TD"]
    for p in sorted(meta["packages"], key=lambda p: p["name"]):
        deps = sorted(
            {
                d["name"]
                for d in p["dependencies"]
                if d["name"] in members and d.get("kind") is None
            }
        )
        if deps:
            lines.append(f"    {p['name']} --> {' & '.join(deps)}")
        else:
            lines.append(f"    {p['name']}")
    lines.append("```")
    return "\n".join(lines)


def main() -> int:
    g = graph()
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
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
        print(f"{sys.argv[2]}: the crate graph matches the crates")
        return 0
    print(g)
    return 0


if __name__ == "__main__":
    sys.exit(main())
