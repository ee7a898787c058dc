-- The business tables of the MySQL/MariaDB examples, in the database the outbox was migrated
-- into (`outbox migrate --database-url mysql://... --schema DB`): the accounts, and one ledger
-- per account, its entries numbered 1, 2, 3... in commit order. The number comes from the
-- account's row, which the writer's transaction updates first (a lock on one existing row, no
-- gap) and keeps locked until it ends: writers of one account take turns, and a rollback gives
-- the number back. (PostgreSQL's examples take the contract's advisory lock instead: MySQL's
-- GET_LOCK is held by the session, not the transaction.) An account is opened before it is
-- credited: the five the examples credit are opened here.
CREATE TABLE IF NOT EXISTS ledger_accounts (
    account_id VARCHAR(255) NOT NULL PRIMARY KEY,
    last_entry BIGINT       NOT NULL
) ENGINE = InnoDB;

CREATE TABLE IF NOT EXISTS ledger (
    account_id   VARCHAR(255) NOT NULL,
    entry_no     BIGINT       NOT NULL,
    amount_cents BIGINT       NOT NULL,
    producer     VARCHAR(32)  NOT NULL,
    created_at   DATETIME(6)  NOT NULL DEFAULT UTC_TIMESTAMP(6),
    PRIMARY KEY (account_id, entry_no)
) ENGINE = InnoDB;

INSERT IGNORE INTO ledger_accounts (account_id, last_entry)
VALUES ('acct-1', 0), ('acct-2', 0), ('acct-3', 0), ('acct-4', 0), ('acct-5', 0);
