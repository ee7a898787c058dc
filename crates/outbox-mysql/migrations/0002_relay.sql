-- outbox tables, version 2: what relays keep (positions and leases, members, parked messages,
-- the redrive audit). See docs/engine-mysql.md. Every statement can be run again.

-- One row per partition: how far the relay has passed (`passed`: every message of the
-- partition at or below that position was published or parked), who serves the partition
-- under which lease, and the epoch, bumped at each change of owner. A record moves `passed`
-- only from the value its claim read, at the epoch its claim ran under (compare-and-set), so a
-- late or fenced record changes nothing: `recorded` counts the records, and a record names
-- the count its claim read. `parked` counts the partition's rows in
-- `outbox_parked`, kept exact by the same transactions that park and release them.
CREATE TABLE IF NOT EXISTS {schema}.outbox_positions (
    part        SMALLINT     NOT NULL PRIMARY KEY,
    passed      BIGINT       NOT NULL DEFAULT 0,
    parked      BIGINT       NOT NULL DEFAULT 0,
    owner       VARCHAR(255) NULL,
    lease_until DATETIME(6)  NOT NULL DEFAULT '1970-01-01 00:00:00',
    epoch       BIGINT       NOT NULL DEFAULT 0,
    recorded    BIGINT       NOT NULL DEFAULT 0,
    passed_at   DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

INSERT IGNORE INTO {schema}.outbox_positions (part)
WITH RECURSIVE p (part) AS (SELECT 0 UNION ALL SELECT part + 1 FROM p WHERE part < 63)
SELECT part FROM p;

-- Live relay members, to share the partitions fairly, with each one's sink circuit.
CREATE TABLE IF NOT EXISTS {schema}.outbox_members (
    member       VARCHAR(255) NOT NULL PRIMARY KEY,
    heartbeat_at DATETIME(6)  NOT NULL,
    circuit      VARCHAR(16)  NOT NULL DEFAULT 'closed',
    sink_error   TEXT         NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Messages set aside from the flow of their partition: a head to retry (`retrying`, due at
-- `next_attempt_at`), a head given up (`failed`), and the later messages of such a key that the
-- position passed (`waiting`). The message itself stays in `outbox`; this row says why it is
-- out of the flow. A key's parked rows go out in `part_seq` order, the head first.
CREATE TABLE IF NOT EXISTS {schema}.outbox_parked (
    seq             BIGINT       NOT NULL PRIMARY KEY,
    part            SMALLINT     NOT NULL,
    part_seq        BIGINT       NOT NULL,
    aggregate_id    VARCHAR(255) NOT NULL,
    state           VARCHAR(16)  NOT NULL,
    attempts        INT          NOT NULL DEFAULT 0,
    next_attempt_at DATETIME(6)  NULL,
    last_error      TEXT         NULL,
    parked_at       DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    UNIQUE KEY outbox_parked_key (part, aggregate_id, part_seq),
    KEY outbox_parked_state (state, seq),
    CONSTRAINT outbox_parked_state_known CHECK (state IN ('retrying', 'failed', 'waiting'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Every redrive, for audits: which message, its attempts and error when it was redriven, why.
CREATE TABLE IF NOT EXISTS {schema}.outbox_redrives (
    id          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    redriven_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    message_id  CHAR(36)     NOT NULL,
    seq         BIGINT       NOT NULL,
    attempts    INT          NOT NULL,
    last_error  TEXT         NULL,
    reason      TEXT         NOT NULL,
    KEY outbox_redrives_message (message_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
