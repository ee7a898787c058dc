// Writes outbox rows from TypeScript with node-postgres (`pg`), by the SQL contract
// (docs/sql-contract.md). Each transaction credits an account: the account's next ledger entry
// (the business write) and its `account.credited` event (the outbox row) commit together, or
// neither does.
import { randomBytes } from 'node:crypto';
import pg from 'pg';

const DATABASE_URL = process.env.DATABASE_URL ?? 'postgres://root@127.0.0.1:5432/test';
const SCHEMA = process.env.OUTBOX_SCHEMA ?? 'public'; // the schema given to `outbox migrate`
const TRANSACTIONS = Number(process.env.TRANSACTIONS ?? 200);
const ACCOUNTS = ['acct-1', 'acct-2', 'acct-3', 'acct-4', 'acct-5']; // the other examples write them too

export interface CreditCommand {
  accountId: string;
  amountCents: number;
  n: number;
  dryRun?: boolean;
}

export interface Credit {
  messageId: string;
  entryNo: number;
  traceparent: string;
  committed: boolean;
}

/** All the SQL of one credit, inside the caller's transaction. */
async function writeCredit(tx: pg.ClientBase, cmd: CreditCommand, traceparent: string) {
  // 1. The per-key lock of the contract (section 2 b), the same one every writer of this key
  //    takes. It comes first because the entry number below is read under it too.
  await tx.query("SELECT pg_advisory_xact_lock(hashtext('outbox:' || $1), hashtext($2))", [
    SCHEMA,
    cmd.accountId,
  ]);
  // 2. The business write: the account's next ledger entry.
  const entry = await tx.query<{ entry_no: string }>(
    `INSERT INTO ledger (account_id, entry_no, amount_cents, producer)
     SELECT $1, coalesce(max(entry_no), 0) + 1, $2, 'typescript'
     FROM ledger WHERE account_id = $1
     RETURNING entry_no`,
    [cmd.accountId, cmd.amountCents],
  );
  const entryNo = Number(entry.rows[0].entry_no); // bigint arrives as a string
  // 3. The outbox row, in the same transaction: JSON as text, cast in SQL.
  const message = await tx.query<{ id: string }>(
    `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
     VALUES ($1, $2, $3, $4::jsonb, $5::jsonb)
     RETURNING id`,
    [
      'account',
      cmd.accountId,
      'account.credited',
      JSON.stringify({
        account_id: cmd.accountId,
        entry_no: entryNo,
        amount_cents: cmd.amountCents,
        producer: 'typescript',
        n: cmd.n,
      }),
      JSON.stringify({ traceparent }),
    ],
  );
  return { messageId: message.rows[0].id, entryNo };
}

/**
 * The service method. In a NestJS app it is a method of an `@Injectable() AccountsService` that
 * holds the pool; here it is a plain function. A dry run does every write, then rolls them back.
 */
export async function creditAccount(pool: pg.Pool, cmd: CreditCommand): Promise<Credit> {
  const traceparent = `00-${randomBytes(16).toString('hex')}-${randomBytes(8).toString('hex')}-01`;
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const { messageId, entryNo } = await writeCredit(client, cmd, traceparent);
    // ROLLBACK: no ledger entry, no outbox row, so the event never exists.
    await client.query(cmd.dryRun ? 'ROLLBACK' : 'COMMIT');
    return { messageId, entryNo, traceparent, committed: !cmd.dryRun };
  } catch (err) {
    await client.query('ROLLBACK');
    throw err;
  } finally {
    client.release();
  }
}

const pool = new pg.Pool({
  connectionString: DATABASE_URL,
  options: `-c search_path=${SCHEMA}`,
  max: 1,
});
try {
  for (let n = 1; n <= TRANSACTIONS; n++) {
    const accountId = ACCOUNTS[n % ACCOUNTS.length];
    // Every 13th credit is a dry run, rolled back on purpose.
    const c = await creditAccount(pool, { accountId, amountCents: 100 + n, n, dryRun: n % 13 === 0 });
    // One line per transaction, read by scripts/examples.sh.
    const outcome = c.committed ? 'committed' : 'rolled_back';
    console.log(`${outcome} typescript ${n} ${c.messageId} ${accountId} ${c.entryNo} ${c.traceparent}`);
  }
} finally {
  await pool.end();
}
