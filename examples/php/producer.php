<?php
// Writes outbox rows from PHP with PDO, by the SQL contract (docs/sql-contract.md): PostgreSQL
// (pdo_pgsql) or, with a mysql:// URL, MySQL/MariaDB (pdo_mysql, section 8 of the contract).
// Each transaction credits an account: the account's next ledger entry (the business write) and
// its `account.credited` event (the outbox row) commit together, or neither does.
declare(strict_types=1);

$url = getenv('DATABASE_URL') ?: 'postgres://root@127.0.0.1:5432/test';
$schema = getenv('OUTBOX_SCHEMA') ?: 'public'; // the schema given to `outbox migrate`
$transactions = (int) (getenv('TRANSACTIONS') ?: 200);
const ACCOUNTS = ['acct-1', 'acct-2', 'acct-3', 'acct-4', 'acct-5']; // the other examples write them too

/** All the SQL of one credit, inside the caller's transaction: [message id, entry number]. */
function writeCredit(PDO $tx, string $schema, string $accountId, int $amountCents, int $n, string $traceparent): array
{
    // 1. The per-key lock of the contract (section 2 b), the same one every writer of this key
    //    takes. It comes first because the entry number below is read under it too.
    $tx->prepare("SELECT pg_advisory_xact_lock(hashtext('outbox:' || ?), hashtext(?))")
        ->execute([$schema, $accountId]);

    // 2. The business write: the account's next ledger entry.
    $st = $tx->prepare("INSERT INTO ledger (account_id, entry_no, amount_cents, producer)
                        SELECT :account, coalesce(max(entry_no), 0) + 1, :amount, 'php'
                        FROM ledger WHERE account_id = :account
                        RETURNING entry_no");
    $st->execute(['account' => $accountId, 'amount' => $amountCents]);
    $entryNo = (int) $st->fetchColumn();

    // 3. The outbox row, in the same transaction: JSON as text, cast in SQL. Headers must encode
    //    as a JSON object: json_encode([]) would give `[]` (see the contract, section 3).
    $st = $tx->prepare('INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
                        VALUES (?, ?, ?, ?::jsonb, ?::jsonb)
                        RETURNING id');
    $st->execute([
        'account', $accountId, 'account.credited',
        json_encode(['account_id' => $accountId, 'entry_no' => $entryNo, 'amount_cents' => $amountCents,
                     'producer' => 'php', 'n' => $n], JSON_THROW_ON_ERROR),
        json_encode(['traceparent' => $traceparent], JSON_THROW_ON_ERROR),
    ]);
    return [$st->fetchColumn(), $entryNo];
}

/**
 * The same credit on MySQL/MariaDB: [message id, entry number]. The outbox table's trigger gives
 * the row its key's position and keeps it until commit, so no lock is taken for the outbox; the
 * outbox row goes last (the contract, section 8), and the message id is made here (no RETURNING
 * on MySQL).
 */
function writeCreditMysql(PDO $tx, string $accountId, int $amountCents, int $n, string $traceparent): array
{
    // 1. The business write: the account's row, locked until commit, gives the number.
    $st = $tx->prepare('UPDATE ledger_accounts SET last_entry = last_entry + 1 WHERE account_id = ?');
    $st->execute([$accountId]);
    if ($st->rowCount() !== 1) {
        throw new RuntimeException("no account $accountId");
    }
    $st = $tx->prepare('SELECT last_entry FROM ledger_accounts WHERE account_id = ?');
    $st->execute([$accountId]);
    $entryNo = (int) $st->fetchColumn();
    $tx->prepare("INSERT INTO ledger (account_id, entry_no, amount_cents, producer) VALUES (?, ?, ?, 'php')")
        ->execute([$accountId, $entryNo, $amountCents]);

    // 2. The outbox row, last: JSON as text into the JSON columns.
    $id = uuidV4();
    $tx->prepare('INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
                  VALUES (?, ?, ?, ?, ?, ?)')
        ->execute([
            $id, 'account', $accountId, 'account.credited',
            json_encode(['account_id' => $accountId, 'entry_no' => $entryNo, 'amount_cents' => $amountCents,
                         'producer' => 'php', 'n' => $n], JSON_THROW_ON_ERROR),
            json_encode(['traceparent' => $traceparent], JSON_THROW_ON_ERROR),
        ]);
    return [$id, $entryNo];
}

/** A random UUID as 8-4-4-4-12 text, the form the outbox's `id` takes. */
function uuidV4(): string
{
    $b = random_bytes(16);
    $b[6] = chr((ord($b[6]) & 0x0f) | 0x40);
    $b[8] = chr((ord($b[8]) & 0x3f) | 0x80);
    return vsprintf('%s%s-%s-%s-%s-%s%s%s', str_split(bin2hex($b), 4));
}

/** The service method: one transaction. A dry run does every write, then rolls them back. */
function creditAccount(PDO $pdo, string $schema, string $accountId, int $amountCents, int $n, bool $dryRun = false): array
{
    $traceparent = sprintf('00-%s-%s-01', bin2hex(random_bytes(16)), bin2hex(random_bytes(8)));
    $pdo->beginTransaction();
    try {
        [$messageId, $entryNo] = $pdo->getAttribute(PDO::ATTR_DRIVER_NAME) === 'mysql'
            ? writeCreditMysql($pdo, $accountId, $amountCents, $n, $traceparent)
            : writeCredit($pdo, $schema, $accountId, $amountCents, $n, $traceparent);
        if ($dryRun) {
            $pdo->rollBack(); // no ledger entry, no outbox row: the event never exists
        } else {
            $pdo->commit();
        }
    } catch (Throwable $e) {
        $pdo->rollBack();
        throw $e;
    }
    return ['message_id' => $messageId, 'entry_no' => $entryNo, 'traceparent' => $traceparent,
            'committed' => !$dryRun];
}

// PDO takes a DSN, not a URL. On PostgreSQL `options` sets the search_path: unqualified `outbox`
// and `ledger`. On MySQL the URL's database holds them.
$u = parse_url($url);
$mysql = in_array($u['scheme'], ['mysql', 'mariadb'], true);
$pdo = new PDO(
    $mysql
        ? sprintf('mysql:host=%s;port=%d;dbname=%s;charset=utf8mb4', $u['host'], $u['port'] ?? 3306, ltrim($u['path'], '/'))
        : sprintf("pgsql:host=%s;port=%d;dbname=%s;options='-c search_path=%s'",
            $u['host'], $u['port'] ?? 5432, ltrim($u['path'], '/'), $schema),
    isset($u['user']) ? urldecode($u['user']) : null,
    isset($u['pass']) ? urldecode($u['pass']) : null,
    [PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION],
);

for ($n = 1; $n <= $transactions; $n++) {
    $accountId = ACCOUNTS[$n % count(ACCOUNTS)];
    // Every 13th credit is a dry run, rolled back on purpose.
    $c = creditAccount($pdo, $schema, $accountId, 100 + $n, $n, $n % 13 === 0);
    // One line per transaction, read by scripts/examples.sh.
    printf("%s php %d %s %s %d %s\n", $c['committed'] ? 'committed' : 'rolled_back', $n, $c['message_id'],
        $accountId, $c['entry_no'], $c['traceparent']);
}
