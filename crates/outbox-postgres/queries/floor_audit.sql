-- Rows lying at or below their partition's floor although their transaction got its id after
-- the floor was read (`txid >= done_bound AND seq <= done_floor`): the claim's A2 would pass
-- over them. Engine version 5 reads the floor under the sequence's lock, so there are none;
-- this check keeps proving it, cheaply: per partition it reads the first $1 entries of the
-- (partition, txid, seq) index at or above the latest position's bound (the transactions that
-- began right after the floor was read, the only ones a floor read too high could catch),
-- so it costs at most 64 × $1 index entries, whatever the backlog.
SELECT coalesce(sum(c.below), 0)::int8 AS below
FROM generate_series(0, 63) AS g(partition)
CROSS JOIN LATERAL (
    SELECT x.done_bound, x.done_floor FROM {schema}.outbox_positions AS x
    WHERE x.partition = g.partition
    ORDER BY x.id DESC
    LIMIT 1
) AS lp
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE f.seq <= lp.done_floor) AS below
    FROM (
        SELECT o.seq FROM {schema}.outbox AS o
        WHERE o.partition = g.partition AND o.txid >= lp.done_bound
        ORDER BY o.txid, o.seq
        LIMIT $1
    ) AS f
) AS c
