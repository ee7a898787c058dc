"""An application written for Debezium's Outbox Event Router, from Python with psycopg 3: it
writes Debezium's documented outbox table (id, aggregatetype, aggregateid, type, payload,
tracingspancontext) and deletes each row right after inserting it, as Debezium advises. Its
INSERTs are unchanged; `outbox migrate --adopt-debezium` makes the relay publish them
(docs/migrating-from-debezium.md).

Each transaction credits an account: the account's next ledger entry (the business write) and
its `account.credited` event commit together, or neither does.
"""

import os
import secrets
import uuid

import psycopg
from psycopg.types.json import Jsonb

DATABASE_URL = os.environ.get("DATABASE_URL", "postgres://root@127.0.0.1:5432/test")
SCHEMA = os.environ.get("OUTBOX_SCHEMA", "public")
TABLE = os.environ.get("DEBEZIUM_TABLE", "debezium_outbox")  # the table Debezium captured
TRANSACTIONS = int(os.environ.get("TRANSACTIONS", "200"))
ACCOUNTS = ["acct-1", "acct-2", "acct-3", "acct-4", "acct-5"]  # the other examples write them too


def credit_account(conn: psycopg.Connection, account_id: str, amount_cents: int, n: int,
                   dry_run: bool) -> tuple[str, int, str]:
    traceparent = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    event_id = str(uuid.uuid4())
    with conn.transaction():
        # The business lock of this account (the ledger numbers its entries under it); every
        # writer of the account takes it, so its events are written in commit order.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('outbox:' || %s), hashtext(%s))",
                     (SCHEMA, account_id))
        (entry_no,) = conn.execute(
            """INSERT INTO ledger (account_id, entry_no, amount_cents, producer)
               SELECT %(account)s, coalesce(max(entry_no), 0) + 1, %(amount)s, 'debezium'
               FROM ledger WHERE account_id = %(account)s
               RETURNING entry_no""",
            {"account": account_id, "amount": amount_cents},
        ).fetchone()
        # Debezium's outbox INSERT, as its documentation writes it.
        conn.execute(
            f"""INSERT INTO {TABLE} (id, aggregatetype, aggregateid, type, payload,
                                     tracingspancontext)
                VALUES (%s, %s, %s, %s, %s, %s)""",
            (event_id, "account", account_id, "account.credited",
             Jsonb({"account_id": account_id, "entry_no": entry_no,
                    "amount_cents": amount_cents, "producer": "debezium", "n": n}),
             f"traceparent={traceparent}\n"),
        )
        conn.execute(f"DELETE FROM {TABLE} WHERE id = %s", (event_id,))
        if dry_run:
            raise psycopg.Rollback()
    return event_id, entry_no, traceparent


def main() -> None:
    with psycopg.connect(DATABASE_URL, autocommit=True,
                         options=f"-c search_path={SCHEMA}") as conn:
        for n in range(1, TRANSACTIONS + 1):
            account_id = ACCOUNTS[n % len(ACCOUNTS)]
            dry_run = n % 13 == 0
            event_id, entry_no, traceparent = credit_account(conn, account_id, 100 + n, n,
                                                             dry_run)
            print("rolled_back" if dry_run else "committed", "debezium", n, event_id,
                  account_id, entry_no, traceparent)


if __name__ == "__main__":
    main()
