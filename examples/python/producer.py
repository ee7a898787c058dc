"""Writes outbox rows from Python with psycopg 3, by the SQL contract (docs/sql-contract.md).

Each transaction credits an account: the account's next ledger entry (the business write) and
its `account.credited` event (the outbox row) commit together, or neither does.
"""

import os
import secrets
from dataclasses import dataclass

import psycopg
from psycopg.types.json import Jsonb

DATABASE_URL = os.environ.get("DATABASE_URL", "postgres://root@127.0.0.1:5432/test")
SCHEMA = os.environ.get("OUTBOX_SCHEMA", "public")  # the schema given to `outbox migrate`
TRANSACTIONS = int(os.environ.get("TRANSACTIONS", "200"))
ACCOUNTS = ["acct-1", "acct-2", "acct-3", "acct-4", "acct-5"]  # the other examples write them too


@dataclass
class Credit:
    message_id: str
    entry_no: int
    traceparent: str
    committed: bool


def write_credit(conn: psycopg.Connection, account_id: str, amount_cents: int, n: int,
                 traceparent: str) -> tuple[str, int]:
    """All the SQL of one credit, inside the caller's transaction: (message id, entry number)."""
    # 1. The per-key lock of the contract (section 2 b), the same one every writer of this key
    #    takes. It comes first because the entry number below is read under it too.
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('outbox:' || %s), hashtext(%s))",
                 (SCHEMA, account_id))
    # 2. The business write: the account's next ledger entry.
    (entry_no,) = conn.execute(
        """INSERT INTO ledger (account_id, entry_no, amount_cents, producer)
           SELECT %(account)s, coalesce(max(entry_no), 0) + 1, %(amount)s, 'python'
           FROM ledger WHERE account_id = %(account)s
           RETURNING entry_no""",
        {"account": account_id, "amount": amount_cents},
    ).fetchone()
    # 3. The outbox row, in the same transaction. The id defaults to a UUIDv7 made by the table.
    (message_id,) = conn.execute(
        """INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
           VALUES (%s, %s, %s, %s, %s)
           RETURNING id::text""",
        ("account", account_id, "account.credited",
         Jsonb({"account_id": account_id, "entry_no": entry_no, "amount_cents": amount_cents,
                "producer": "python", "n": n}),
         Jsonb({"traceparent": traceparent})),
    ).fetchone()
    return message_id, entry_no


def credit_account(conn: psycopg.Connection, account_id: str, amount_cents: int, n: int,
                   dry_run: bool = False) -> Credit:
    """The service method: one transaction. A dry run does every write, then rolls them back."""
    traceparent = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    with conn.transaction():  # BEGIN ... COMMIT, or ROLLBACK when the block raises
        message_id, entry_no = write_credit(conn, account_id, amount_cents, n, traceparent)
        if dry_run:
            raise psycopg.Rollback()  # no ledger entry, no outbox row: the event never exists
    return Credit(message_id, entry_no, traceparent, committed=not dry_run)


def main() -> None:
    # autocommit: each `with conn.transaction()` block is one explicit transaction.
    with psycopg.connect(DATABASE_URL, autocommit=True,
                         options=f"-c search_path={SCHEMA}") as conn:
        for n in range(1, TRANSACTIONS + 1):
            account_id = ACCOUNTS[n % len(ACCOUNTS)]
            # Every 13th credit is a dry run, rolled back on purpose.
            c = credit_account(conn, account_id, 100 + n, n, dry_run=n % 13 == 0)
            # One line per transaction, read by scripts/examples.sh.
            print("committed" if c.committed else "rolled_back", "python", n, c.message_id,
                  account_id, c.entry_no, c.traceparent)


if __name__ == "__main__":
    main()
