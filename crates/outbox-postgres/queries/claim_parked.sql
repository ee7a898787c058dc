-- Parked messages that are due, for the owned partitions that have any: for every parked key
-- whose head (its lowest parked seq) is due, that key's parked rows in seq order, so a released
-- key drains in order at batch speed. With $3 (the default `block` policy) a failed head holds
-- its key, and a failed row further down holds every row of its key behind it; with `skip`
-- failed rows are passed over and the rest of the key flows.
--
-- Cost: the heads are found by a loose scan of the (partition, aggregate_id, seq) index, one
-- probe per parked key, never a read of every parked row (a stuck key with ten thousand rows
-- behind it is one probe); only the due keys' rows are then read, at most $2 each. The relay
-- runs this only for partitions whose position counts parked messages, and only when a head
-- may have come due (see `ParkedReads` in store/claim.rs), not on every claim.
--
-- Bytes: rows are measured in seq order and returned while the running sum of their payloads'
-- text length stays within $5, the first one whatever its size when $6 allows it; the LIMIT
-- stops the running sum, so a payload past $4 rows is never rendered.
--
-- Always one row at least: `next_due`, the earliest next attempt of a head not yet due (NULL
-- when none), and `keyed`, the partitions where a parked key was found, with no message when
-- nothing is due.
--
-- $1 partitions (int2[]), $2 rows per key, $3 failed rows block their key, $4 rows in all,
-- $5 payload bytes, $6 an oversized first row may go alone
WITH RECURSIVE heads AS (
    SELECT h.*
    FROM unnest($1::int2[]) AS p(partition)
    CROSS JOIN LATERAL (
        SELECT x.partition, x.aggregate_id, x.seq, x.state, x.next_attempt_at
        FROM {schema}.outbox_parked AS x
        WHERE x.partition = p.partition AND (x.state <> 'failed' OR $3::boolean)
        ORDER BY x.aggregate_id, x.seq
        LIMIT 1
    ) AS h
    UNION ALL
    SELECT n.*
    FROM heads
    CROSS JOIN LATERAL (
        SELECT x.partition, x.aggregate_id, x.seq, x.state, x.next_attempt_at
        FROM {schema}.outbox_parked AS x
        WHERE x.partition = heads.partition AND x.aggregate_id > heads.aggregate_id
          AND (x.state <> 'failed' OR $3::boolean)
        ORDER BY x.aggregate_id, x.seq
        LIMIT 1
    ) AS n
), measured AS (
    SELECT r.*,
           sum(octet_length(r.payload::text)) OVER w AS bytes_upto,
           count(*) OVER w AS handed_upto
    FROM heads AS h
    CROSS JOIN LATERAL (
        -- The key's rows in seq order. Under block a failed row is read too, and nothing from
        -- it on is handed out (`behind`): a row parked at a seq after a failed row of its key
        -- waits for that row's redrive, even when the head ahead of the failure is due. The
        -- relay parks a key in seq order, so a failure is its key's head; but a layout with a
        -- due row ahead of a failed one can still be written (a CDC copy parked at another seq
        -- before N2's fix, a raw writer that took no key lock, a hand-made repair), and the
        -- rows behind the failure must not overtake it. Under skip failed rows are not read.
        SELECT y.* FROM (
            SELECT x.*,
                   bool_or(x.state = 'failed') OVER (ORDER BY x.seq ROWS UNBOUNDED PRECEDING)
                       AS behind
            FROM {schema}.outbox_parked AS x
            WHERE x.partition = h.partition AND x.aggregate_id = h.aggregate_id
              AND (x.state <> 'failed' OR $3::boolean)
            ORDER BY x.seq
            LIMIT $2
        ) AS y
        WHERE NOT y.behind
    ) AS r
    WHERE h.state <> 'failed' AND (h.next_attempt_at IS NULL OR h.next_attempt_at <= now())
    WINDOW w AS (ORDER BY r.seq ROWS UNBOUNDED PRECEDING)
    ORDER BY r.seq
    LIMIT $4
), later AS (
    SELECT min(h.next_attempt_at) FILTER (WHERE h.state <> 'failed' AND h.next_attempt_at > now())
             AS next_due,
           array_agg(DISTINCT h.partition) AS keyed
    FROM heads AS h
)
SELECT later.next_due, later.keyed, m.partition, m.seq, m.id, m.aggregate_type, m.aggregate_id,
       m.event_type, m.payload::text AS payload, m.headers::text AS headers, m.topic,
       m.created_at, m.attempts, m.state, m.bytes_upto, m.handed_upto
FROM later
LEFT JOIN (
    SELECT * FROM measured
    WHERE measured.bytes_upto <= $5::int8 OR (measured.handed_upto = 1 AND $6::boolean)
) AS m ON true
ORDER BY m.seq
