<?php
// An application written for Debezium's Outbox Event Router on MySQL/MariaDB, with PDO: it
// writes Debezium's documented outbox table (id, aggregatetype, aggregateid, type, payload,
// tracingspancontext) and deletes each row right after inserting it, as Debezium advises. Its
// INSERTs are unchanged; `outbox migrate --adopt-debezium` makes the relay publish them
// (docs/migrating-from-debezium.md).
// Each transaction credits an account: the account's next ledger entry (the business write) and
// its `account.credited` event commit together, or neither does.
declare(strict_types=1);

$url = getenv('DATABASE_URL') ?: 'mysql://root@127.0.0.1:3306/test';
$table = getenv('DEBEZIUM_TABLE') ?: 'debezium_outbox'; // the table Debezium captured
$transactions = (int) (getenv('TRANSACTIONS') ?: 200);
const ACCOUNTS = ['acct-1', 'acct-2', 'acct-3', 'acct-4', 'acct-5']; // the other examples write them too

function uuidV4(): string
{
    $b = random_bytes(16);
    $b[6] = chr((ord($b[6]) & 0x0f) | 0x40);
    $b[8] = chr((ord($b[8]) & 0x3f) | 0x80);
    return vsprintf('%s%s-%s-%s-%s-%s%s%s', str_split(bin2hex($b), 4));
}

$u = parse_url($url);
$pdo = new PDO(
    sprintf('mysql:host=%s;port=%d;dbname=%s;charset=utf8mb4', $u['host'], $u['port'] ?? 3306, ltrim($u['path'], '/')),
    isset($u['user']) ? urldecode($u['user']) : null,
    isset($u['pass']) ? urldecode($u['pass']) : null,
    [PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION],
);

for ($n = 1; $n <= $transactions; $n++) {
    $accountId = ACCOUNTS[$n % count(ACCOUNTS)];
    $dryRun = $n % 13 === 0; // every 13th credit is rolled back on purpose
    $traceparent = sprintf('00-%s-%s-01', bin2hex(random_bytes(16)), bin2hex(random_bytes(8)));
    $id = uuidV4();
    $pdo->beginTransaction();
    try {
        // The business write: the account's row, locked until commit, gives the number.
        $st = $pdo->prepare('UPDATE ledger_accounts SET last_entry = last_entry + 1 WHERE account_id = ?');
        $st->execute([$accountId]);
        $st = $pdo->prepare('SELECT last_entry FROM ledger_accounts WHERE account_id = ?');
        $st->execute([$accountId]);
        $entryNo = (int) $st->fetchColumn();
        $pdo->prepare("INSERT INTO ledger (account_id, entry_no, amount_cents, producer) VALUES (?, ?, ?, 'debezium')")
            ->execute([$accountId, $entryNo, 100 + $n]);
        // Debezium's outbox INSERT, then the DELETE Debezium advises.
        $pdo->prepare("INSERT INTO $table (id, aggregatetype, aggregateid, type, payload, tracingspancontext)
                       VALUES (?, ?, ?, ?, ?, ?)")
            ->execute([
                $id, 'account', $accountId, 'account.credited',
                json_encode(['account_id' => $accountId, 'entry_no' => $entryNo, 'amount_cents' => 100 + $n,
                             'producer' => 'debezium', 'n' => $n], JSON_THROW_ON_ERROR),
                "traceparent=$traceparent\n",
            ]);
        $pdo->prepare("DELETE FROM $table WHERE id = ?")->execute([$id]);
        $dryRun ? $pdo->rollBack() : $pdo->commit();
    } catch (Throwable $e) {
        $pdo->rollBack();
        throw $e;
    }
    printf("%s debezium %d %s %s %d %s\n", $dryRun ? 'rolled_back' : 'committed', $n, $id, $accountId, $entryNo,
        $traceparent);
}
