-- outbox schema, version 3: the insert-only engine (see docs/engine.md).
--
-- The message table becomes append-only on the hot path. A row records the transaction that
-- inserted it (`txid`, the top-level xid even inside a savepoint); relays keep their progress as
-- positions (two snapshots and a seq cursor per relay partition) in `outbox_positions`, append
-- only; messages to retry, and the later messages of their key, are copied into the small
-- `outbox_parked` table. Nothing UPDATEs or DELETEs a message row, so a long transaction
-- elsewhere in the database leaves no dead versions for claims to walk. Retention drops whole
-- txid-ranged segments (declarative partitions) once every position has passed them.
--
-- Upgrade in place: the version 1 table is renamed `outbox_v1`; its pending, retrying and failed
-- rows are copied into the new table with their ids and seqs, in seq order (retrying and failed
-- heads also into `outbox_parked`, with their attempts and errors). Published history stays in
-- `outbox_v1` (dropped here when it is empty); drop it when you no longer need it.

ALTER TABLE {schema}.outbox RENAME TO outbox_v1;
ALTER TABLE {schema}.outbox_v1 RENAME CONSTRAINT outbox_pkey TO outbox_v1_pkey;
ALTER TABLE {schema}.outbox_v1 RENAME CONSTRAINT outbox_seq_key TO outbox_v1_seq_key;
ALTER TABLE {schema}.outbox_v1 RENAME CONSTRAINT outbox_state_check TO outbox_v1_state_check;
ALTER TABLE {schema}.outbox_v1 RENAME CONSTRAINT outbox_created_at_check TO outbox_v1_created_at_check;
DROP INDEX IF EXISTS {schema}.outbox_pending_idx;
DROP INDEX IF EXISTS {schema}.outbox_retrying_idx;
DROP INDEX IF EXISTS {schema}.outbox_failed_idx;
DROP INDEX IF EXISTS {schema}.outbox_published_idx;
-- The notifying trigger serialised every writer's commit; NOTIFY is now opt-in
-- (`outbox migrate --notify`).
DROP TRIGGER IF EXISTS outbox_notify ON {schema}.outbox_v1;
DROP FUNCTION IF EXISTS {schema}.outbox_notify();

CREATE TABLE {schema}.outbox (
    -- written by applications -------------------------------------------------------------
    id              uuid        NOT NULL DEFAULT {schema}.outbox_uuid_v7(),
    aggregate_type  text        NOT NULL,
    aggregate_id    text        NOT NULL,
    event_type      text        NOT NULL,
    payload         jsonb       NOT NULL,
    headers         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    topic           text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- filled in by defaults; never written by applications -----------------------------------
    -- The inserting transaction's top-level id: what makes a row visible to a relay position.
    txid            xid8        NOT NULL DEFAULT pg_current_xact_id(),
    -- Insert order; the order of messages within one key and one window.
    seq             bigint      GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME {schema}.outbox_seq_v2),
    -- Which relay partition serves this row: a stable hash of the ordering key.
    partition       smallint    NOT NULL
                    GENERATED ALWAYS AS (((hashtext(aggregate_id) & 2147483647) % 64)::smallint) STORED,
    CONSTRAINT outbox_created_at_check CHECK (created_at BETWEEN '1900-01-01' AND '9999-12-31')
) PARTITION BY RANGE (txid);

-- Claims read the newest part of a window in seq order from a floor below which none of its rows
-- can lie...
CREATE INDEX outbox_partition_seq_idx ON {schema}.outbox (partition, seq) INCLUDE (txid);
-- ... and the rest (transactions that were already running when the window opened) by txid.
CREATE INDEX outbox_partition_txid_idx ON {schema}.outbox (partition, txid) INCLUDE (seq);

-- Settings of this outbox: segment width in transaction ids.
CREATE TABLE {schema}.outbox_settings (
    name  text PRIMARY KEY,
    value text NOT NULL
);
INSERT INTO {schema}.outbox_settings (name, value) VALUES ('segment_xids', '20000000');

-- One row per segment (a partition of `outbox` over a txid range). `closed_at` is set by
-- maintenance once the current transaction id has passed `hi`: retention counts from there.
CREATE TABLE {schema}.outbox_segments (
    name       text        PRIMARY KEY,
    lo         xid8        NOT NULL,
    hi         xid8        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    closed_at  timestamptz
);

-- Creates segments so that the next `lookahead` widths of transaction ids are covered. A new
-- segment is made outside the partition tree and ATTACHed with a matching CHECK constraint:
-- ATTACH takes SHARE UPDATE EXCLUSIVE on `outbox`, which writers (ROW EXCLUSIVE) and readers
-- (ACCESS SHARE, pg_dump included) do not conflict with, where CREATE TABLE ... PARTITION OF
-- would take ACCESS EXCLUSIVE and queue every writer behind any open transaction.
-- Returns how many segments it created.
CREATE OR REPLACE FUNCTION {schema}.outbox_ensure_segments(lookahead integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
  width bigint := (SELECT value::bigint FROM {schema}.outbox_settings WHERE name = 'segment_xids');
  now_xid bigint := pg_snapshot_xmax(pg_current_snapshot())::text::bigint;
  top bigint;
  seg text;
  made integer := 0;
BEGIN
  SELECT max(hi::text::bigint) INTO top FROM {schema}.outbox_segments;
  IF top IS NULL THEN
    top := 0;
  END IF;
  -- Transaction ids already past the last segment (maintenance did not run for a long time):
  -- one segment reaches over them, so no insert is left without a home for longer.
  WHILE top < now_xid + lookahead * width LOOP
    seg := format('outbox_s%s', lpad(top::text, 20, '0'));
    EXECUTE format('CREATE TABLE {schema}.%I (LIKE {schema}.outbox INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING CONSTRAINTS)', seg);
    EXECUTE format('ALTER TABLE {schema}.%I ADD CONSTRAINT %I CHECK (txid >= %L::xid8 AND txid < %L::xid8)',
                   seg, seg || '_range', top, GREATEST(top + width, now_xid + 1));
    EXECUTE format('ALTER TABLE {schema}.outbox ATTACH PARTITION {schema}.%I FOR VALUES FROM (%L) TO (%L)',
                   seg, top, GREATEST(top + width, now_xid + 1));
    EXECUTE format('ALTER TABLE {schema}.%I DROP CONSTRAINT %I', seg, seg || '_range');
    INSERT INTO {schema}.outbox_segments (name, lo, hi)
    VALUES (seg, top::text::xid8, GREATEST(top + width, now_xid + 1)::text::xid8);
    top := GREATEST(top + width, now_xid + 1);
    made := made + 1;
  END LOOP;
  UPDATE {schema}.outbox_segments SET closed_at = now()
  WHERE closed_at IS NULL AND hi::text::bigint <= now_xid;
  RETURN made;
END
$$;

-- The first segment starts at 0 so that every existing transaction id has a home.
SELECT {schema}.outbox_ensure_segments(2);

-- A relay partition's position, appended at every recorded batch (never updated): the window
-- (`done`, `cur`) and the last seq handled inside it (`cursor`). With lo = xmax(done) and
-- hi = xmax(cur), the window holds the rows whose txid is visible in `cur` and not in `done`:
-- txids in [lo, hi), plus the ids `done` saw running. `done_bound` is a transaction id assigned
-- after `done` was taken (the id of the transaction that recorded it), so every transaction that
-- had an id when `done` was taken has a smaller one; `done_floor` is the sequence's high-water
-- mark read before `done` was taken, so every row of a transaction whose id is at or above
-- `done_bound` has a seq above it. `cur_bound`/`cur_floor` are the same for `cur`. `published`
-- is the partition's running total. The latest row per partition (by id) is the position;
-- older ones are pruned.
CREATE TABLE {schema}.outbox_positions (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    partition   smallint    NOT NULL,
    epoch       bigint      NOT NULL,
    done        pg_snapshot NOT NULL,
    done_bound  xid8        NOT NULL,
    done_floor  bigint      NOT NULL,
    done_at     timestamptz NOT NULL,
    cur         pg_snapshot,
    cur_bound   xid8,
    cur_floor   bigint,
    cur_at      timestamptz,
    cursor      bigint      NOT NULL DEFAULT 0,
    published   bigint      NOT NULL DEFAULT 0,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_positions_latest_idx ON {schema}.outbox_positions (partition, id DESC);

-- The starting position: a snapshot in which this very transaction (and everything after it)
-- is not yet visible, so the rows copied below form the first window.
INSERT INTO {schema}.outbox_positions (partition, epoch, done, done_bound, done_floor, done_at)
SELECT g, 0, (pg_current_xact_id()::text || ':' || pg_current_xact_id()::text || ':')::pg_snapshot,
       pg_current_xact_id(), 0, now()
FROM generate_series(0, 63) AS g;

-- Messages waiting for a retry ('retrying'), given up ('failed'), or queued behind either of
-- those in their key ('waiting'). A copy of the message, so retention never depends on it. Small
-- by design: parking is capped per partition.
CREATE TABLE {schema}.outbox_parked (
    partition       smallint    NOT NULL,
    seq             bigint      NOT NULL,
    aggregate_id    text        NOT NULL,
    id              uuid        NOT NULL,
    aggregate_type  text        NOT NULL,
    event_type      text        NOT NULL,
    payload         jsonb       NOT NULL,
    headers         jsonb       NOT NULL,
    topic           text,
    created_at      timestamptz NOT NULL,
    state           text        NOT NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz,
    last_error      text,
    parked_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT outbox_parked_pkey PRIMARY KEY (partition, seq),
    CONSTRAINT outbox_parked_state_check CHECK (state IN ('retrying', 'waiting', 'failed'))
);
CREATE INDEX outbox_parked_key_idx ON {schema}.outbox_parked (partition, aggregate_id, seq);

-- Copy the version 1 backlog, keeping ids and seqs. A message that was retrying or failed goes
-- to the parked table only (below): copied into both, it would be published once from the
-- window under `--on-failed skip` while `outbox failed` still listed it.
INSERT INTO {schema}.outbox
    (id, aggregate_type, aggregate_id, event_type, payload, headers, topic, created_at, seq)
OVERRIDING SYSTEM VALUE
SELECT id, aggregate_type, aggregate_id, event_type, payload, headers, topic, created_at, seq
FROM {schema}.outbox_v1
WHERE state = 'pending' AND attempts = 0
ORDER BY seq;

INSERT INTO {schema}.outbox_parked
    (partition, seq, aggregate_id, id, aggregate_type, event_type, payload, headers, topic,
     created_at, state, attempts, next_attempt_at, last_error)
SELECT partition, seq, aggregate_id, id, aggregate_type, event_type, payload, headers, topic,
       created_at, CASE WHEN state = 'failed' THEN 'failed' ELSE 'retrying' END, attempts,
       CASE WHEN state = 'failed' THEN NULL ELSE COALESCE(next_attempt_at, now()) END, last_error
FROM {schema}.outbox_v1
WHERE state = 'failed' OR (state = 'pending' AND attempts > 0);

-- New seqs continue after the copied ones, so order across the upgrade holds.
DO $$
DECLARE
  top bigint := (SELECT max(seq) FROM {schema}.outbox_v1);
BEGIN
  IF top IS NOT NULL THEN
    PERFORM setval('{schema}.outbox_seq_v2', top);
  END IF;
  IF NOT EXISTS (SELECT 1 FROM {schema}.outbox_v1) THEN
    DROP TABLE {schema}.outbox_v1;
  END IF;
END
$$;
