-- CDC mode: a mark for the next checkpoint. A snapshot S, the seq floor F read after it, and the
-- WAL insert position L read after both: every transaction visible in S committed before S was
-- taken, so its commit record ends at or before L. Once the slot's confirmed position reaches L,
-- every row visible in S was published or parked by the CDC relay (or, for rows written before
-- the slot existed, by the polling relay: cdc_checkpoint.sql checks that). B, a transaction id
-- assigned after F was read, is the checkpoint's `done_bound`: taken here rather than by the
-- checkpoint (a maintenance round later), it stays close to S, so a polling window that starts
-- at the checkpoint probes a few ids, not a round's worth (the select list is evaluated in
-- order: the snapshot, then the floor, then the id).
SELECT pg_current_snapshot()::text AS snapshot,
       {schema}.outbox_seq_floor() AS floor,
       pg_current_wal_insert_lsn()::text AS lsn,
       pg_current_xact_id()::text AS bound
