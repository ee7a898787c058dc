-- Transaction ids consumed since backend $1 took its snapshot: how far the held snapshot
-- holds the horizon back. NULL when the backend holds no snapshot.
SELECT age(backend_xmin) FROM pg_stat_activity WHERE pid = $1
