"""The broker side of scripts/examples.sh: a JetStream stream for one run, a start gate for the
producers, and the checker that reads the stream with its own consumer.

  examples_check.py stream-add    --stream S --prefix P
  examples_check.py stream-delete --stream S
  examples_check.py gate  --database-url URL --schema S --producers N --ready FILE
  examples_check.py check --database-url URL --schema S --stream S --prefix P --records DIR
  examples_check.py mysql-script --database-url URL --schema DB --file SQL   (MySQL/MariaDB)
  examples_check.py mysql-drop   --database-url URL --schema DB              (MySQL/MariaDB)

A mysql:// or mariadb:// URL names the server; --schema is then the database that holds the
outbox (`outbox migrate --schema`) and the ledger.

Every producer prints one line per transaction:
  committed|rolled_back LANGUAGE N MESSAGE_ID ACCOUNT ENTRY_NO TRACEPARENT
and the checker holds the stream to those lines and to the database.
"""

import argparse
import asyncio
import json
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from urllib.parse import unquote, urlparse

import nats
import psycopg
import pymysql
from nats.js.api import StorageType

EVENT_TYPE = "account.credited"
AGGREGATE_TYPE = "account"


@dataclass(frozen=True)
class Record:
    outcome: str
    language: str
    n: int
    message_id: str
    account: str
    entry_no: int
    traceparent: str


def is_mysql(url: str) -> bool:
    return urlparse(url).scheme in ("mysql", "mariadb")


def retrying(open_connection, errors):
    """Connects, retrying for a while: other tests on this machine restart the databases."""
    for attempt in range(30):
        try:
            return open_connection()
        except errors:
            if attempt == 29:
                raise
            time.sleep(1)
    raise AssertionError("unreachable")


def connect(url: str) -> psycopg.Connection:
    return retrying(lambda: psycopg.connect(url), psycopg.OperationalError)


def connect_mysql(url: str, database: str | None = None) -> pymysql.connections.Connection:
    """A session on the MySQL/MariaDB server of `url`, in `database` (the URL's by default)."""
    u = urlparse(url)
    return retrying(
        lambda: pymysql.connect(
            host=u.hostname or "127.0.0.1", port=u.port or 3306,
            user=unquote(u.username or "root"), password=unquote(u.password or ""),
            database=database or u.path.lstrip("/") or None, autocommit=True),
        pymysql.err.OperationalError)


def mysql_rows(url: str, database: str, sql: str) -> list[tuple]:
    conn = connect_mysql(url, database)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())
    finally:
        conn.close()


def mysql_script(args) -> int:
    """Runs a file of `;`-separated statements (no `;` inside them) in the database."""
    conn = connect_mysql(args.database_url, args.schema)
    try:
        with conn.cursor() as cur:
            text = "\n".join(line for line in Path(args.file).read_text().splitlines()
                             if not line.lstrip().startswith("--"))
            for statement in filter(None, (s.strip() for s in text.split(";"))):
                cur.execute(statement)
    finally:
        conn.close()
    return 0


def mysql_drop(args) -> int:
    conn = connect_mysql(args.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{args.schema}`")
    finally:
        conn.close()
    return 0


def read_records(directory: Path) -> list[Record]:
    records = []
    for path in sorted(directory.glob("*.out")):
        for line in path.read_text().splitlines():
            outcome, language, n, message_id, account, entry_no, traceparent = line.split()
            records.append(Record(outcome, language, int(n), message_id, account, int(entry_no),
                                  traceparent))
    return records


async def stream_add(args) -> int:
    nc = await nats.connect(args.nats)
    try:
        await nc.jetstream().add_stream(name=args.stream, subjects=[f"{args.prefix}.>"],
                                        storage=StorageType.MEMORY)
    finally:
        await nc.close()
    return 0


async def stream_delete(args) -> int:
    nc = await nats.connect(args.nats)
    try:
        await nc.jetstream().delete_stream(args.stream)
    finally:
        await nc.close()
    return 0


# Counts the sessions that wait, directly or behind another waiter, on the gate's lock. (pg_locks,
# not pg_stat_activity: the latter is a snapshot taken once per transaction.)
WAITERS = """
WITH RECURSIVE waiting(pid) AS (
    SELECT pid FROM pg_locks WHERE NOT granted AND pg_backend_pid() = ANY (pg_blocking_pids(pid))
    UNION
    SELECT l.pid FROM pg_locks l JOIN waiting w ON NOT l.granted AND w.pid = ANY (pg_blocking_pids(l.pid)))
SELECT count(DISTINCT pid) FROM waiting
"""


def gate(args) -> int:
    """Holds the ledger table until every producer waits on it, so that all the languages start
    writing the same keys at the same moment (a JVM starts later than a PHP script)."""
    if is_mysql(args.database_url):
        return gate_mysql(args)
    with connect(args.database_url) as conn:
        conn.execute(f"LOCK TABLE {args.schema}.ledger IN EXCLUSIVE MODE")
        Path(args.ready).write_text("locked\n")
        deadline = time.monotonic() + args.timeout
        waiting = 0
        while time.monotonic() < deadline:
            (waiting,) = conn.execute(WAITERS).fetchone()
            if waiting >= args.producers:
                break
            time.sleep(0.05)
        print(f"gate: {waiting} of {args.producers} producers were waiting when it opened")
    return 0 if waiting >= args.producers else 1


def gate_mysql(args) -> int:
    """The gate on MySQL/MariaDB: every producer's first statement writes `ledger_accounts`,
    which waits on this session's table lock."""
    conn = connect_mysql(args.database_url, args.schema)
    waiting = 0
    try:
        with conn.cursor() as cur:
            cur.execute("LOCK TABLES ledger_accounts WRITE")
            Path(args.ready).write_text("locked\n")
            deadline = time.monotonic() + args.timeout
            while time.monotonic() < deadline:
                cur.execute(
                    "SELECT COUNT(*) FROM information_schema.PROCESSLIST"
                    " WHERE DB = %s AND ID <> CONNECTION_ID() AND STATE LIKE 'Waiting for table%%'",
                    (args.schema,))
                (waiting,) = cur.fetchone()
                if waiting >= args.producers:
                    break
                time.sleep(0.05)
            cur.execute("UNLOCK TABLES")
    finally:
        conn.close()
    print(f"gate: {waiting} of {args.producers} producers were waiting when it opened")
    return 0 if waiting >= args.producers else 1


async def consume(args, expected: set[str]) -> list:
    """Reads the stream from its start with an ephemeral pull consumer, until every expected id
    has arrived (or the deadline), then for a grace period to see anything extra arrive."""
    nc = await nats.connect(args.nats)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe(f"{args.prefix}.>", stream=args.stream)
        messages, seen = [], set()
        deadline = time.monotonic() + args.timeout
        grace_end = None
        while True:
            now = time.monotonic()
            if grace_end is None and (expected <= seen or now >= deadline):
                grace_end = now + args.grace
            if grace_end is not None and now >= grace_end:
                break
            try:
                batch = await sub.fetch(500, timeout=0.5)
            except (nats.errors.TimeoutError, asyncio.TimeoutError):  # nothing new yet
                continue
            for msg in batch:
                messages.append(msg)
                seen.add((msg.headers or {}).get("outbox-message-id"))
                await msg.ack()
        await sub.unsubscribe()
        return messages
    finally:
        await nc.close()


def check(args) -> int:
    records = read_records(Path(args.records))
    committed = {r.message_id: r for r in records if r.outcome == "committed"}
    rolled_back = {r.message_id: r for r in records if r.outcome == "rolled_back"}
    results: list[tuple[str, bool, str]] = []

    def result(name: str, ok: bool, detail: str) -> None:
        results.append((name, ok, detail))

    # The producers' own account of what they did.
    languages = sorted({r.language for r in records})
    per_language = {
        lang: (sum(1 for r in committed.values() if r.language == lang),
               sum(1 for r in rolled_back.values() if r.language == lang))
        for lang in languages}
    for lang, (c, rb) in per_language.items():
        print(f"producer {lang:<10} committed {c:>4}, rolled back {rb:>3}")
    result("every language committed rows and rolled some back",
           len(languages) == args.languages and all(c > 0 and rb > 0 for c, rb in per_language.values()),
           f"{len(languages)} languages: {', '.join(languages)}")

    # The database's account: the outbox holds exactly the committed rows; the ledger agrees.
    if is_mysql(args.database_url):
        stored = {row[0] for row in mysql_rows(args.database_url, args.schema,
                                               "SELECT id FROM outbox")}
        ledger = dict(mysql_rows(args.database_url, args.schema,
                                 "SELECT account_id, count(*) FROM ledger GROUP BY account_id"))
    else:
        with connect(args.database_url) as conn:
            stored = {row[0] for row in conn.execute(f"SELECT id::text FROM {args.schema}.outbox")}
            ledger = dict(conn.execute(
                f"SELECT account_id, count(*) FROM {args.schema}.ledger GROUP BY account_id").fetchall())
    result("the outbox table holds exactly the committed rows",
           stored == set(committed),
           f"{len(stored)} rows; not reported committed: {len(stored - set(committed))}; "
           f"reported committed but absent: {len(set(committed) - stored)}")

    # Entry numbers are drawn under the per-key lock, so each key's committed entries are 1..N,
    # each once, numbered in commit order (a rolled-back entry's number is drawn again).
    by_key: dict[str, list[Record]] = defaultdict(list)
    for r in committed.values():
        by_key[r.account].append(r)
    gapless = all(sorted(r.entry_no for r in rs) == list(range(1, len(rs) + 1))
                  for rs in by_key.values())
    result("each key's committed entries are numbered 1..N (the writers serialised on the lock)",
           gapless and ledger == {k: len(rs) for k, rs in by_key.items()},
           f"{len(by_key)} keys, ledger counts {dict(sorted(ledger.items()))}")

    # The broker's account.
    messages = asyncio.run(consume(args, set(committed)))
    arrivals: list[tuple[str, dict]] = []  # (message id, payload) in stream order
    header_errors: list[str] = []
    for msg in messages:
        headers = msg.headers or {}
        mid = headers.get("outbox-message-id", "")
        payload = json.loads(msg.data)
        arrivals.append((mid, payload))
        rec = committed.get(mid)
        if rec is None:
            continue
        want = {
            "outbox-message-id": rec.message_id,
            "outbox-event-type": EVENT_TYPE,
            "outbox-aggregate-type": AGGREGATE_TYPE,
            "outbox-aggregate-id": rec.account,
            "Nats-Msg-Id": rec.message_id,
            "traceparent": rec.traceparent,
        }
        wrong = {k: headers.get(k) for k, v in want.items() if headers.get(k) != v}
        if msg.subject != f"{args.prefix}.{EVENT_TYPE}":
            wrong["subject"] = msg.subject
        if (payload.get("account_id"), payload.get("entry_no"), payload.get("producer"),
                payload.get("n")) != (rec.account, rec.entry_no, rec.language, rec.n):
            wrong["payload"] = payload
        if wrong:
            header_errors.append(f"{mid}: {wrong}")

    arrived = Counter(mid for mid, _ in arrivals)
    missing = set(committed) - set(arrived)
    ghosts = set(arrived) & set(rolled_back)
    unknown = set(arrived) - set(committed) - set(rolled_back)
    duplicates = sum(c - 1 for c in arrived.values())
    print(f"broker     {len(messages)} messages on {args.prefix}.>, {len(arrived)} distinct ids, "
          f"{duplicates} redelivered")
    result("every committed row arrived", not missing,
           f"{len(committed) - len(missing)} of {len(committed)}"
           + (f"; missing e.g. {sorted(missing)[:3]}" if missing else ""))
    result("no rolled-back row arrived, nor anything else", not ghosts and not unknown,
           f"{len(ghosts)} of {len(rolled_back)} rolled back, {len(unknown)} unknown")
    result("headers, subject and payload as written", not header_errors,
           f"{len(arrivals) - len(header_errors)} of {len(arrivals)} right"
           + (f"; e.g. {header_errors[0]}" if header_errors else ""))

    # Per-key order: consumers deduplicate on outbox-message-id, so take each id's first
    # arrival. Each key's entry numbers must then read 1, 2, ..., N in stream order: the order
    # its transactions committed in, whichever language wrote them.
    first_seen: set[str] = set()
    order: dict[str, list[int]] = defaultdict(list)
    writers: dict[str, list[str]] = defaultdict(list)
    for mid, payload in arrivals:
        if mid in first_seen or mid not in committed:
            continue
        first_seen.add(mid)
        order[payload["account_id"]].append(payload["entry_no"])
        writers[payload["account_id"]].append(payload["producer"])
    out_of_order = {k: v for k, v in order.items() if v != list(range(1, len(by_key[k]) + 1))}
    result("per-key order: each key's events arrive in commit order", not out_of_order and order,
           f"{len(order)} keys" + "".join(
               f"; {k} arrived as {v[:12]}..." for k, v in sorted(out_of_order.items())[:2]))

    # The order check means something only if the languages wrote the same keys at once: count,
    # per key, how often the next entry (in commit order) came from another language. Languages
    # writing one after the other would give (languages - 1) hand-offs per key; more means their
    # transactions on the key interleaved.
    handoffs = {k: sum(1 for a, b in zip(ws, ws[1:]) if a != b) for k, ws in writers.items()}
    for key in sorted(writers):
        print(f"key {key:<8} {len(writers[key]):>4} events from {len(set(writers[key]))} languages, "
              f"{handoffs[key]:>4} hand-offs between languages")
    result("keys written by several languages at once",
           bool(writers) and all(len(set(ws)) == len(languages) for ws in writers.values())
           and all(h >= args.languages for h in handoffs.values()),
           f"{sum(handoffs.values())} hand-offs in all")

    failed = 0
    for name, ok, detail in results:
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
    print(f"examples: {len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nats", default="nats://127.0.0.1:4222")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("stream-add")
    s.add_argument("--stream", required=True)
    s.add_argument("--prefix", required=True)
    s = sub.add_parser("stream-delete")
    s.add_argument("--stream", required=True)
    s = sub.add_parser("gate")
    s.add_argument("--database-url", required=True)
    s.add_argument("--schema", required=True)
    s.add_argument("--producers", type=int, required=True)
    s.add_argument("--ready", required=True)
    s.add_argument("--timeout", type=float, default=30)
    s = sub.add_parser("check")
    s.add_argument("--database-url", required=True)
    s.add_argument("--schema", required=True)
    s.add_argument("--stream", required=True)
    s.add_argument("--prefix", required=True)
    s.add_argument("--records", required=True)
    s.add_argument("--languages", type=int, default=4)
    s.add_argument("--timeout", type=float, default=60, help="seconds to wait for the committed rows")
    s.add_argument("--grace", type=float, default=1.0, help="seconds to keep reading after them")
    s = sub.add_parser("mysql-script")
    s.add_argument("--database-url", required=True)
    s.add_argument("--schema", required=True)
    s.add_argument("--file", required=True)
    s = sub.add_parser("mysql-drop")
    s.add_argument("--database-url", required=True)
    s.add_argument("--schema", required=True)
    args = p.parse_args()
    if args.command == "stream-add":
        return asyncio.run(stream_add(args))
    if args.command == "stream-delete":
        return asyncio.run(stream_delete(args))
    if args.command == "gate":
        return gate(args)
    if args.command == "mysql-script":
        return mysql_script(args)
    if args.command == "mysql-drop":
        return mysql_drop(args)
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
