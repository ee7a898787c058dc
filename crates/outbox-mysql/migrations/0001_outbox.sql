-- outbox tables, version 1, for MySQL 8.0 and MariaDB 10.6+ (tested on MariaDB 10.11). See
-- docs/engine-mysql.md for why each part is shaped as it is. `{schema}` is the database that
-- holds the outbox (validated before it is spliced in).

-- The messages. Insert-only: nothing updates or deletes a row; old rows go with their range.
-- `seq` is drawn at insert (AUTO_INCREMENT), so it is NOT commit order; `part` and `part_seq`
-- are, per partition: the trigger below draws `part_seq` from a counter row the writer's
-- transaction keeps locked until it ends.
CREATE TABLE IF NOT EXISTS {schema}.outbox (
    seq             BIGINT       NOT NULL AUTO_INCREMENT,
    id              CHAR(36)     NOT NULL DEFAULT (UUID()),
    aggregate_type  VARCHAR(255) NOT NULL,
    aggregate_id    VARCHAR(255) NOT NULL,
    event_type      VARCHAR(255) NOT NULL,
    payload         JSON         NOT NULL,
    headers         JSON         NOT NULL DEFAULT ('{}'),
    topic           VARCHAR(255) NULL,
    created_at      TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    part            SMALLINT     NOT NULL DEFAULT 0,
    part_seq        BIGINT       NOT NULL DEFAULT 0,
    PRIMARY KEY (seq),
    KEY outbox_part_seq (part, part_seq),
    KEY outbox_id (id)
) ENGINE = InnoDB;

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
-- without a second read; MySQL and MariaDB restore the session's own value when the trigger ends.
-- DDL commits as it goes on MySQL, so a migration interrupted here is run again whole: every
-- statement of it can be.
DROP TRIGGER IF EXISTS {schema}.outbox_position;
CREATE TRIGGER {schema}.outbox_position BEFORE INSERT ON {schema}.outbox
FOR EACH ROW
BEGIN
    SET NEW.part = CRC32(NEW.aggregate_id) % 64;
    UPDATE {schema}.outbox_part_seq SET n = LAST_INSERT_ID(n + 1) WHERE part = NEW.part;
    SET NEW.part_seq = LAST_INSERT_ID();
END;
