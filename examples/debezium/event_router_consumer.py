"""A consumer written to the documented output of Debezium's Outbox Event Router, with its
defaults (https://debezium.io/documentation/reference/transformations/outbox-event-router.html):

- the topic is `outbox.event.<aggregatetype>`;
- the record key is the row's `aggregateid`;
- the header `id` is the row's `id`;
- the value is the row's `payload`: with Kafka Connect's JsonConverter (schemas off) and a JSON
  column, a JSON *string* holding the payload's JSON.

Nothing in it knows about `outbox`: it is what a team's consumer looks like before the switch, and
it must keep working after it (docs/migrating-from-debezium.md). It reads the account events the
example applications of this folder wrote, and checks them against what the applications say
they committed (their standard output, one line per transaction):

    committed|rolled_back debezium <n> <event id> <account> <entry no> <traceparent>

Checks: every committed event arrives (at least once), no rolled-back or unknown event does, the
key, `id` header and value are the Event Router's, and each account's events arrive in the order
of its ledger entries (commit order). Exits non-zero on any failure.

    event_router_consumer.py --bootstrap 127.0.0.1:9092 --topic outbox.event.account \
        --records DIR [--timeout 90]
"""

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition


def read_records(directory: Path) -> tuple[dict, set]:
    """The applications' lines: committed events by id, and the ids they rolled back."""
    committed, rolled_back = {}, set()
    for path in sorted(directory.glob("*.out")):
        for line in path.read_text().splitlines():
            outcome, _lang, n, event_id, account, entry_no, traceparent = line.split()
            if outcome == "committed":
                committed[event_id] = (account, int(entry_no), int(n), traceparent)
            else:
                rolled_back.add(event_id)
    return committed, rolled_back


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument("--topic", default="outbox.event.account")
    p.add_argument("--records", required=True, type=Path)
    p.add_argument("--timeout", type=float, default=90.0)
    args = p.parse_args()
    committed, rolled_back = read_records(args.records)

    consumer = Consumer({
        "bootstrap.servers": args.bootstrap,
        "group.id": f"event-router-consumer-{uuid.uuid4()}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    # Every partition from its start, assigned rather than joined as a group: a check reads the
    # whole topic once and has no offsets to share (a service would subscribe with its group id).
    partitions = consumer.list_topics(args.topic, timeout=10).topics[args.topic].partitions
    consumer.assign([TopicPartition(args.topic, p, OFFSET_BEGINNING) for p in partitions])
    failures: list[str] = []
    seen: set[str] = set()
    duplicates = 0
    last_entry: dict[str, int] = {}
    deadline = time.monotonic() + args.timeout
    try:
        while len(seen) < len(committed) and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    failures.append(f"consume error: {msg.error()}")
                continue
            headers = {k: (v or b"").decode() for k, v in (msg.headers() or [])}
            event_id = headers.get("id")
            key = (msg.key() or b"").decode()
            if event_id is None:
                failures.append(f"a record without the `id` header (key {key!r})")
                continue
            if event_id in rolled_back:
                failures.append(f"{event_id}: rolled back, yet published (a phantom)")
                continue
            if event_id not in committed:
                failures.append(f"{event_id}: no application committed it")
                continue
            account, entry_no, n, traceparent = committed[event_id]
            if key != account:
                failures.append(f"{event_id}: key {key!r}, the aggregateid is {account!r}")
            # The JsonConverter's form of a JSON column: a JSON string holding the payload.
            value = json.loads(json.loads(msg.value()))
            want = {"account_id": account, "entry_no": entry_no, "amount_cents": 100 + n,
                    "producer": "debezium", "n": n}
            if value != want:
                failures.append(f"{event_id}: value {value}, the payload was {want}")
            if event_id in seen:
                duplicates += 1  # at-least-once: a redelivery is allowed, not counted for order
                continue
            seen.add(event_id)
            prev = last_entry.get(account, 0)
            if entry_no <= prev:
                failures.append(f"{account}: entry {entry_no} after entry {prev} (out of order)")
            last_entry[account] = entry_no
    finally:
        consumer.close()

    missing = len(committed) - len(seen)
    if missing:
        failures.append(f"{missing} of {len(committed)} committed events never arrived "
                        f"within {args.timeout:.0f} s")
    print(f"event router consumer: {len(seen)} of {len(committed)} committed events read on "
          f"{args.topic}, {len(rolled_back)} rolled back absent, {duplicates} redelivered, "
          f"per-key order checked on {len(last_entry)} keys")
    for f in failures[:20]:
        print(f"  FAIL {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
