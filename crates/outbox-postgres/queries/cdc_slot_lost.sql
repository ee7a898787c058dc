-- Whether the slot is lost or invalidated (the columns PostgreSQL 16 and 17 added are read from
-- the row's JSON image, so an older server reads them as NULL); no row when there is no slot.
SELECT s.wal_status = 'lost'
       OR (to_jsonb(s) ->> 'invalidation_reason') IS NOT NULL
       OR coalesce((to_jsonb(s) ->> 'conflicting')::boolean, false)
FROM pg_replication_slots AS s
WHERE s.slot_name = $1 AND s.database = current_database()
