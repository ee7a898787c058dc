-- outbox tables, version 1, for MySQL 8.0.29+ and MariaDB 10.6+ (tested on MariaDB 10.11 only).
-- See docs/engine-mysql.md for why each part is shaped as it is. `{schema}` is the database that
-- holds the outbox (validated before it is spliced in). DDL commits as it goes on MySQL, so a
-- migration interrupted half-way is run again whole: every statement here can be.
--
-- Text is utf8mb4 with a binary collation: a key is the same key only byte for byte, as it is
-- for the partition hash and for PostgreSQL. Times are UTC DATETIMEs (TIMESTAMP ends in 2038).

-- The messages. Insert-only: nothing updates or deletes a row; old rows go with their range.
-- `seq` is drawn at insert (AUTO_INCREMENT), so it is NOT commit order; `part` and `part_seq`
-- are, per partition: the trigger below draws `part_seq` from a counter row the writer's
-- transaction keeps locked until it ends. A row without a position would never be relayed,
-- so the CHECK (evaluated after the trigger) refuses one.
CREATE TABLE IF NOT EXISTS {schema}.outbox (
    seq             BIGINT       NOT NULL AUTO_INCREMENT,
    id              CHAR(36)     NOT NULL DEFAULT (UUID()),
    aggregate_type  VARCHAR(255) NOT NULL,
    aggregate_id    VARCHAR(255) NOT NULL,
    event_type      VARCHAR(255) NOT NULL,
    payload         JSON         NOT NULL,
    headers         JSON         NOT NULL DEFAULT ('{}'),
    topic           VARCHAR(255) NULL,
    created_at      DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    part            SMALLINT     NOT NULL DEFAULT -1,
    part_seq        BIGINT       NOT NULL DEFAULT 0,
    PRIMARY KEY (seq),
    KEY outbox_part_seq (part, part_seq),
    KEY outbox_id (id),
    CONSTRAINT outbox_positioned CHECK (part >= 0 AND part_seq > 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One row per partition: the last `part_seq` handed out there. Its row lock is the writers'
-- queue; a rollback undoes the increment, so positions are gapless.
CREATE TABLE IF NOT EXISTS {schema}.outbox_part_seq (
    part SMALLINT NOT NULL PRIMARY KEY,
    n    BIGINT   NOT NULL
) ENGINE = InnoDB;

INSERT IGNORE INTO {schema}.outbox_part_seq (part, n)
WITH RECURSIVE p (part) AS (SELECT 0 UNION ALL SELECT part + 1 FROM p WHERE part < 63)
SELECT part, 0 FROM p;

-- Every writer, the plain four-column INSERT of another language included, gets its partition
-- (by the key) and its position here. LAST_INSERT_ID(expr) hands the incremented value back
-- without a second read; MySQL and MariaDB restore the session's own value when the trigger
-- ends. A missing counter row fails the insert rather than reusing a stale value.
CREATE TRIGGER IF NOT EXISTS {schema}.outbox_position BEFORE INSERT ON {schema}.outbox
FOR EACH ROW
BEGIN
    SET NEW.part = CRC32(NEW.aggregate_id) % 64;
    UPDATE {schema}.outbox_part_seq SET n = LAST_INSERT_ID(n + 1) WHERE part = NEW.part;
    IF ROW_COUNT() <> 1 THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox: no position counter for this partition; run outbox migrate';
    END IF;
    SET NEW.part_seq = LAST_INSERT_ID();
END;
