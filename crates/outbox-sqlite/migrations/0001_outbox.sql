-- outbox tables, version 1, for SQLite 3.35+ (generated columns, RETURNING, UPDATE ... FROM).
-- SQLite has no schemas: the table names are fixed, one outbox per database file.
-- Times the relay compares (`next_attempt_at`, `lease_until`, `heartbeat_at`) are INTEGER unix
-- milliseconds bound by the relay, so no statement needs clock arithmetic; times people read
-- (`created_at`, `published_at`) are RFC 3339 text in UTC with milliseconds.

CREATE TABLE IF NOT EXISTS outbox (
    -- owned by the relay -------------------------------------------------------------------
    -- Insert order; the order of messages within one key. SQLite has one writer at a time, so
    -- insert order within a key is also commit order. AUTOINCREMENT: never reused.
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    -- written by applications -------------------------------------------------------------
    -- UUIDv7 made in SQL when the app gives none: 48 bits of unix milliseconds, version 7,
    -- variant 10, the rest random; lower-case 8-4-4-4-12. Random within one millisecond, so the
    -- relay orders by `seq`, never by `id`. An app that gives its own id must give it in this
    -- lower-case hyphenated form.
    id              TEXT    NOT NULL DEFAULT (lower(
                          substr(printf('%012x', CAST(round((julianday('now') - 2440587.5) * 86400000) AS INTEGER)), 1, 8)
                       || '-'
                       || substr(printf('%012x', CAST(round((julianday('now') - 2440587.5) * 86400000) AS INTEGER)), 9, 4)
                       || '-7' || substr(hex(randomblob(2)), 2, 3)
                       || '-' || substr('89ab', 1 + (random() & 3), 1) || substr(hex(randomblob(2)), 2, 3)
                       || '-' || hex(randomblob(6))))
                    CHECK (length(id) = 36 AND id = lower(id)
                           AND length(replace(id, '-', '')) = 32
                           AND substr(id, 9, 1) = '-' AND substr(id, 14, 1) = '-'
                           AND substr(id, 19, 1) = '-' AND substr(id, 24, 1) = '-'
                           AND id NOT GLOB '*[^0-9a-f-]*'),
    -- typeof checks: SQLite would store a BLOB here, and one undecodable row must not stall a
    -- relay's claims.
    aggregate_type  TEXT    NOT NULL CHECK (typeof(aggregate_type) = 'text'),
    aggregate_id    TEXT    NOT NULL CHECK (typeof(aggregate_id) = 'text'),
    event_type      TEXT    NOT NULL CHECK (typeof(event_type) = 'text'),
    -- Stored and published as the text the app wrote (no normalisation, unlike PostgreSQL).
    payload         TEXT    NOT NULL CHECK (json_valid(payload)),
    headers         TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(headers)),
    topic           TEXT    CHECK (topic IS NULL OR typeof(topic) = 'text'),
    created_at      TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
                    CHECK (julianday(created_at) IS NOT NULL),
    -- owned by the relay -------------------------------------------------------------------
    -- Which relay partition (0-63) serves this row, derived from the ordering key in SQL so raw
    -- inserts from any language get it too. SQLite has no hash function, so this is a crude,
    -- deterministic one: sampled characters (the last six weighted like decimal places, so
    -- numbered keys spread evenly; the first two; three inside), the length and the count of
    -- each digit, reduced modulo a prime. It decides only how work spreads over relay members,
    -- never correctness: a key always maps to one partition, whatever the spread.
    partition       INTEGER NOT NULL GENERATED ALWAYS AS ((
                          coalesce(unicode(substr(aggregate_id, -1, 1)), 0)
                        + coalesce(unicode(substr(aggregate_id, -2, 1)), 0) * 10
                        + coalesce(unicode(substr(aggregate_id, -3, 1)), 0) * 100
                        + coalesce(unicode(substr(aggregate_id, -4, 1)), 0) * 1000
                        + coalesce(unicode(substr(aggregate_id, -5, 1)), 0) * 10007
                        + coalesce(unicode(substr(aggregate_id, -6, 1)), 0) * 100003
                        + coalesce(unicode(substr(aggregate_id, 1, 1)), 0) * 7
                        + coalesce(unicode(substr(aggregate_id, 2, 1)), 0) * 131
                        + coalesce(unicode(substr(aggregate_id, length(aggregate_id) / 3 + 1, 1)), 0) * 1000003
                        + coalesce(unicode(substr(aggregate_id, length(aggregate_id) / 2 + 1, 1)), 0) * 5003
                        + coalesce(unicode(substr(aggregate_id, 2 * length(aggregate_id) / 3 + 1, 1)), 0) * 50021
                        + length(aggregate_id) * 1009
                        + (length(aggregate_id) - length(replace(aggregate_id, '0', ''))) * 3
                        + (length(aggregate_id) - length(replace(aggregate_id, '1', ''))) * 29
                        + (length(aggregate_id) - length(replace(aggregate_id, '2', ''))) * 67
                        + (length(aggregate_id) - length(replace(aggregate_id, '3', ''))) * 113
                        + (length(aggregate_id) - length(replace(aggregate_id, '4', ''))) * 173
                        + (length(aggregate_id) - length(replace(aggregate_id, '5', ''))) * 229
                        + (length(aggregate_id) - length(replace(aggregate_id, '6', ''))) * 281
                        + (length(aggregate_id) - length(replace(aggregate_id, '7', ''))) * 349
                        + (length(aggregate_id) - length(replace(aggregate_id, '8', ''))) * 409
                        + (length(aggregate_id) - length(replace(aggregate_id, '9', ''))) * 463
                    ) % 65521 % 64) STORED,
    state           TEXT    NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'published', 'failed')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    -- unix milliseconds; NULL when no retry is scheduled.
    next_attempt_at INTEGER,
    last_error      TEXT,
    published_at    TEXT
);

CREATE UNIQUE INDEX IF NOT EXISTS outbox_id_key ON outbox (id);
-- The claim reads pending rows in seq order and keeps those of the member's partitions. One
-- SQLite file is served by few relay members, so a single (seq) order beats one index range
-- per partition; the partial index holds only pending rows however many published rows stay.
CREATE INDEX IF NOT EXISTS outbox_pending_idx ON outbox (seq) WHERE state = 'pending';
-- Keys whose head is waiting for a retry (few rows): the claim skips those keys.
CREATE INDEX IF NOT EXISTS outbox_retrying_idx ON outbox (partition, aggregate_id)
    WHERE state = 'pending' AND attempts > 0;
-- Failed rows block their key (ordered mode) and are listed by `outbox failed`.
CREATE INDEX IF NOT EXISTS outbox_failed_idx ON outbox (partition, aggregate_id)
    WHERE state = 'failed';
-- Retention purges published rows by age.
CREATE INDEX IF NOT EXISTS outbox_published_idx ON outbox (published_at)
    WHERE state = 'published';

-- One row per relay partition; a relay member owns a partition while its lease runs.
CREATE TABLE IF NOT EXISTS outbox_partitions (
    partition   INTEGER PRIMARY KEY CHECK (partition BETWEEN 0 AND 63),
    owner       TEXT,
    -- unix milliseconds; 0 when free.
    lease_until INTEGER NOT NULL DEFAULT 0,
    -- Bumped at every change of owner; a fencing token for logs and audits.
    epoch       INTEGER NOT NULL DEFAULT 0
);
WITH RECURSIVE g(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n < 63)
INSERT OR IGNORE INTO outbox_partitions (partition) SELECT n FROM g;

-- Live relay members (workers), used to split partitions fairly.
CREATE TABLE IF NOT EXISTS outbox_members (
    member       TEXT    PRIMARY KEY,
    -- unix milliseconds
    heartbeat_at INTEGER NOT NULL
);
