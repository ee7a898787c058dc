#!/usr/bin/env python3
"""Checks that every query of the Grafana dashboard names only metrics the relay and the inbox
export.

The exported metrics come from live scrapes when given (`--scrape FILE`, Prometheus text as
`/metrics` served it: the observability tests save theirs when OUTBOX_SCRAPE_DIR is set), else
from the metric table of docs/operations.md, which a unit test of outbox-observe keeps equal to
the code's catalogue (and the live-scrape tests keep the catalogue equal to what a running
relay and inbox export). A histogram family `x` also exports `x_bucket`, `x_sum` and `x_count`.

Every panel must have at least one query, every query must name at least one `outbox_` metric,
and every `outbox_` name a query uses must be exported. Exits 1 with each problem on a line.

    python3 scripts/check_dashboard.py [--scrape FILE ...] [--docs docs/operations.md] \
        [deploy/grafana/outbox.json ...]
"""

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"\boutbox_[a-zA-Z0-9_:]*")
HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")


def expand(families):
    """Every series name a family exports."""
    names = set()
    for name, kind in families.items():
        names.add(name)
        if kind == "histogram":
            names.update(name + part for part in HISTOGRAM_PARTS)
    return names


def from_scrape(path):
    families = {}
    for line in Path(path).read_text().splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4:
                families[parts[2]] = parts[3]
    if not families:
        raise SystemExit(f"{path}: no `# TYPE` line: not a Prometheus scrape")
    return families


def from_docs(path):
    """Rows `| `name` | type | labels | meaning |` of the metric tables."""
    families = {}
    row = re.compile(r"^\|\s*`(outbox_[a-z0-9_]+)`\s*\|\s*(counter|gauge|histogram)\s*\|")
    for line in Path(path).read_text().splitlines():
        m = row.match(line)
        if m:
            families[m.group(1)] = m.group(2)
    if not families:
        raise SystemExit(f"{path}: no metric table rows found")
    return families


def panels(dashboard):
    """Every panel, rows' nested panels included, rows themselves left out."""
    out = []
    for p in dashboard.get("panels", []):
        if p.get("type") == "row":
            out.extend(x for x in p.get("panels", []) if x.get("type") != "row")
        else:
            out.append(p)
    return out


def balanced(expr):
    pairs = {")": "(", "]": "[", "}": "{"}
    stack = []
    for c in re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr):
        if c in "([{":
            stack.append(c)
        elif c in pairs:
            if not stack or stack.pop() != pairs[c]:
                return False
    return not stack


def check(path, exported):
    problems = []
    dashboard = json.loads(Path(path).read_text())
    used = set()
    ids = set()
    every = panels(dashboard)
    if not every:
        problems.append(f"{path}: no panels")
    queries = 0
    for p in every:
        title = p.get("title") or f"panel {p.get('id')}"
        if p.get("id") in ids:
            problems.append(f"{path}: panel id {p.get('id')} is used twice")
        ids.add(p.get("id"))
        exprs = [t.get("expr", "") for t in p.get("targets", [])]
        if not any(e.strip() for e in exprs):
            problems.append(f"{path}: panel `{title}` has no query")
        for e in exprs:
            queries += 1
            names = set(NAME.findall(e))
            if not names:
                problems.append(f"{path}: panel `{title}`: query `{e}` names no outbox_ metric")
            if not balanced(e):
                problems.append(f"{path}: panel `{title}`: query `{e}` has unbalanced brackets")
            for n in sorted(names - exported):
                problems.append(
                    f"{path}: panel `{title}`: `{n}` is not a metric the relay or the inbox exports"
                )
            used |= names
    for v in dashboard.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query", "") if isinstance(q, dict) else (q or "")
        for n in sorted(set(NAME.findall(q)) - exported):
            problems.append(f"{path}: variable `{v.get('name')}`: `{n}` is not exported")
    return problems, used, len(every), queries


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dashboards", nargs="*", default=[str(ROOT / "deploy/grafana/outbox.json")])
    ap.add_argument("--scrape", action="append", default=[], help="a live /metrics scrape")
    ap.add_argument("--docs", default=str(ROOT / "docs/operations.md"))
    args = ap.parse_args()
    families = {}
    if args.scrape:
        for s in args.scrape:
            families.update(from_scrape(s))
        source = "live scrapes " + ", ".join(args.scrape)
    else:
        families = from_docs(args.docs)
        source = args.docs
    exported = expand(families)
    failed = False
    for d in args.dashboards:
        problems, used, n_panels, n_queries = check(d, exported)
        for p in problems:
            print(p)
        failed |= bool(problems)
        unused = sorted(
            f for f in families if not ({f} | {f + s for s in HISTOGRAM_PARTS}) & used
        )
        print(
            f"{d}: {n_panels} panels, {n_queries} queries, {len(used)} metrics used, "
            f"checked against {len(families)} exported families ({source})"
            + (": OK" if not problems else f": {len(problems)} problem(s)")
        )
        if unused:
            print(f"  exported but on no panel: {', '.join(unused)}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
