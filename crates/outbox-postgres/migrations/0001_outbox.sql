-- outbox schema, version 1. `{schema}` is replaced by the validated schema name and `{channel}`
-- by the LISTEN/NOTIFY channel before this file runs; everything else is plain PostgreSQL 14+ (CREATE OR REPLACE TRIGGER).

-- UUIDv7 (time-ordered) made in SQL, for apps that insert without an id. It is random within one
-- millisecond, so the relay orders by `seq`, never by `id`.
CREATE OR REPLACE FUNCTION {schema}.outbox_uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
  SELECT encode(
    set_bit(set_bit(
      overlay(uuid_send(gen_random_uuid())
              PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
              FROM 1 FOR 6),
      52, 1), 53, 1), 'hex')::uuid
$$;

CREATE TABLE IF NOT EXISTS {schema}.outbox (
    -- written by applications -------------------------------------------------------------
    id              uuid        NOT NULL DEFAULT {schema}.outbox_uuid_v7(),
    aggregate_type  text        NOT NULL,
    aggregate_id    text        NOT NULL,
    event_type      text        NOT NULL,
    payload         jsonb       NOT NULL,
    headers         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    topic           text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- owned by the relay -------------------------------------------------------------------
    -- Insert order; the order of messages within one key. Assigned at insert, not at commit:
    -- see docs/sql-contract.md for what the writer must do so it matches commit order.
    seq             bigint      GENERATED ALWAYS AS IDENTITY,
    -- Which relay partition serves this row: a stable hash of the ordering key.
    partition       smallint    NOT NULL
                    GENERATED ALWAYS AS (((hashtext(aggregate_id) & 2147483647) % 64)::smallint) STORED,
    state           text        NOT NULL DEFAULT 'pending',
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz,
    last_error      text,
    published_at    timestamptz,
    CONSTRAINT outbox_pkey PRIMARY KEY (id),
    CONSTRAINT outbox_seq_key UNIQUE (seq),
    CONSTRAINT outbox_state_check CHECK (state IN ('pending', 'published', 'failed')),
    -- 'infinity' or a date past year 9999 cannot be represented by the relay (or most clients).
    CONSTRAINT outbox_created_at_check CHECK (created_at BETWEEN '1900-01-01' AND '9999-12-31')
);

-- The claim reads each partition's pending rows in seq order; the partial index holds only
-- pending rows, so it stays small however many published rows the table keeps.
CREATE INDEX IF NOT EXISTS outbox_pending_idx ON {schema}.outbox (partition, seq)
    WHERE state = 'pending';
-- Keys whose head is waiting for a retry (few rows): the claim skips those keys.
CREATE INDEX IF NOT EXISTS outbox_retrying_idx ON {schema}.outbox (partition, aggregate_id)
    WHERE state = 'pending' AND attempts > 0;
-- Failed rows block their key (ordered mode) and are listed by `outbox failed`.
CREATE INDEX IF NOT EXISTS outbox_failed_idx ON {schema}.outbox (partition, aggregate_id)
    WHERE state = 'failed';
-- Retention purges published rows by age.
CREATE INDEX IF NOT EXISTS outbox_published_idx ON {schema}.outbox (published_at)
    WHERE state = 'published';

-- One row per relay partition; a relay member owns a partition while its lease runs.
CREATE TABLE IF NOT EXISTS {schema}.outbox_partitions (
    partition   smallint    PRIMARY KEY,
    owner       text,
    lease_until timestamptz NOT NULL DEFAULT '-infinity',
    -- Bumped at every change of owner; a fencing token for logs and audits.
    epoch       bigint      NOT NULL DEFAULT 0
);
INSERT INTO {schema}.outbox_partitions (partition)
SELECT g FROM generate_series(0, 63) AS g
ON CONFLICT (partition) DO NOTHING;

-- Live relay members (workers), used to split partitions fairly.
CREATE TABLE IF NOT EXISTS {schema}.outbox_members (
    member       text        PRIMARY KEY,
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

-- Wake relays at once on insert. One notification per statement, and PostgreSQL folds identical
-- notifications of one transaction into one.
CREATE OR REPLACE FUNCTION {schema}.outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('{channel}', '');
  RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER outbox_notify AFTER INSERT ON {schema}.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.outbox_notify();
