-- CDC mode, at the fallback to polling: the CDC relay parked messages without recording them in
-- the positions' `parked` counts, which the polling engine trusts to know where parked rows
-- are. Each partition whose latest position counts otherwise gets a copy of that position with
-- the true count (compare-and-append: a polling record that got there first wins).
WITH latest AS MATERIALIZED (
    SELECT DISTINCT ON (x.partition) x.*
    FROM {schema}.outbox_positions AS x
    ORDER BY x.partition, x.id DESC
), counts AS (
    SELECT k.partition, count(*) AS n FROM {schema}.outbox_parked AS k GROUP BY k.partition
)
INSERT INTO {schema}.outbox_positions
    (partition, epoch, done, done_bound, done_floor, done_at, cur, cur_bound, cur_floor, cur_at,
     cursor, published, prev_id, parked)
SELECT l.partition, l.epoch, l.done, l.done_bound, l.done_floor, l.done_at, l.cur, l.cur_bound,
       l.cur_floor, l.cur_at, l.cursor, l.published, l.id, COALESCE(c.n, 0)
FROM latest AS l
LEFT JOIN counts AS c ON c.partition = l.partition
WHERE l.parked <> COALESCE(c.n, 0)
ON CONFLICT (partition, prev_id) DO NOTHING
