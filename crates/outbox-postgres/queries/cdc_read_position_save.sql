-- CDC mode: where the slot stands (its restart and confirmed positions, "R C" as text), written
-- at a maintenance round when it moved. If the slot is lost (a failover to a standby that did
-- not have it, an invalidation), the relay reads the WAL back from R and parks the emit messages
-- committed after C (cdc/salvage.rs). $1 the setting's name, $2 the positions.
INSERT INTO {schema}.outbox_settings (name, value) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value
