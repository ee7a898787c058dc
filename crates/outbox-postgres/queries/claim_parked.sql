-- Parked messages that are due, for the owned partitions: for every parked key whose head (its
-- lowest parked seq) is due, that key's parked rows in seq order, so a released key drains in
-- order at batch speed. With $3 (the default `block` policy) a failed head holds its key; with
-- `skip` failed rows are passed over and the rest of the key flows.
-- Bytes: rows are measured in seq order and returned while the running sum of their payloads'
-- text length stays within $5, the first one whatever its size when $6 allows it; the LIMIT
-- stops the running sum, so a payload past $4 rows is never rendered.
-- Reads only the small parked table (and the sequence). $1 partitions (int2[]), $2 rows per key, $3 failed rows
-- block their key, $4 rows in all, $5 payload bytes, $6 an oversized first row may go alone
WITH heads AS (
    SELECT DISTINCT ON (k.partition, k.aggregate_id)
           k.partition, k.aggregate_id, k.state, k.next_attempt_at
    FROM {schema}.outbox_parked AS k
    WHERE k.partition = ANY ($1::int2[]) AND (k.state <> 'failed' OR $3::boolean)
    ORDER BY k.partition, k.aggregate_id, k.seq
), measured AS (
    SELECT r.*,
           sum(octet_length(r.payload::text)) OVER w AS bytes_upto,
           count(*) OVER w AS handed_upto
    FROM heads AS h
    CROSS JOIN LATERAL (
        SELECT * FROM {schema}.outbox_parked AS x
        WHERE x.partition = h.partition AND x.aggregate_id = h.aggregate_id AND x.state <> 'failed'
        ORDER BY x.seq
        LIMIT $2
    ) AS r
    WHERE h.state <> 'failed' AND (h.next_attempt_at IS NULL OR h.next_attempt_at <= now())
    WINDOW w AS (ORDER BY r.seq ROWS UNBOUNDED PRECEDING)
    ORDER BY r.seq
    LIMIT $4
), high AS (
    -- Every seq drawn so far is at most this. Read in this statement, before the window
    -- claim's statement takes its snapshot, it is a floor for that snapshot (claim_window).
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END AS seq_high
    FROM {schema}.outbox_seq_v2 AS s
)
-- Always one row at least: the high-water mark, with no message when nothing is due.
SELECT high.seq_high, m.partition, m.seq, m.id, m.aggregate_type, m.aggregate_id, m.event_type,
       m.payload::text AS payload, m.headers::text AS headers, m.topic, m.created_at,
       m.attempts, m.state, m.bytes_upto, m.handed_upto
FROM high
LEFT JOIN (
    SELECT * FROM measured
    WHERE measured.bytes_upto <= $5::int8 OR (measured.handed_upto = 1 AND $6::boolean)
) AS m ON true
ORDER BY m.seq
