-- Forgets members silent for longer than a lease, then counts the live ones. $1 lease seconds
WITH reaped AS (
    DELETE FROM {schema}.outbox_members WHERE heartbeat_at < now() - make_interval(secs => $1)
)
SELECT count(*) FROM {schema}.outbox_members WHERE heartbeat_at >= now() - make_interval(secs => $1)
