-- CDC mode: where the slot stands (its restart and confirmed positions, "R C" as text), written
-- about once a second while the relay confirms, and at maintenance rounds. If the slot is lost
-- (a failover to a standby that did not have it, an invalidation), the relay reads the WAL back
-- from R and parks the emit messages committed after C (cdc/salvage.rs); any relay of the
-- group can, since this row is replicated with the rest. $1 the setting's name, $2 the slot.
INSERT INTO {schema}.outbox_settings (name, value)
SELECT $1, restart_lsn::text || ' ' || confirmed_flush_lsn::text
FROM pg_replication_slots
WHERE slot_name = $2 AND database = current_database()
  AND restart_lsn IS NOT NULL AND confirmed_flush_lsn IS NOT NULL
ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value
