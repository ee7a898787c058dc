-- A segment whose detach was left half-done (a cancelled DETACH ... CONCURRENTLY) is finished.
-- {segment}: the segment's quoted, schema-qualified name (from our own table).
ALTER TABLE {schema}.outbox DETACH PARTITION {segment} FINALIZE
