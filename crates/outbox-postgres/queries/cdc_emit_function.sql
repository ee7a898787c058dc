-- CDC mode's table-less writer for every language: `SELECT {schema}.outbox_emit('{…}')` inside
-- the business transaction writes the message as a transactional logical message, which the CDC
-- relay publishes once the transaction commits (docs/cdc.md, "The table-less writer").
--
-- Unlike a bare `pg_logical_emit_message`, it refuses to write a message no relay will ever
-- read: without a valid slot for the schema's relay group (lost, invalidated, dropped, or
-- missing on a newly promoted primary) the writer's transaction fails with that reason, so no
-- message is ever lost without its writer seeing an error. It holds a shared advisory lock on
-- the slot until the transaction ends: a relay that drops the slot on purpose takes it
-- exclusively first, so every message that passed the check was written, and is read, before
-- the slot goes. SECURITY DEFINER: writers need EXECUTE on this function only
-- (`outbox migrate --grant writer=…`), and `pg_logical_emit_message` itself can be revoked
-- from PUBLIC. A message without an `id` gets a UUIDv7 here, the same on every redelivery.
CREATE OR REPLACE FUNCTION {schema}.outbox_emit(content text) RETURNS pg_lsn
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  slot text := (SELECT substr(name, length('cdc_start:') + 1) FROM {schema}.outbox_settings
                WHERE left(name, length('cdc_start:')) = 'cdc_start:' LIMIT 1);
  doc jsonb;
BEGIN
  IF slot IS NULL THEN
    RAISE EXCEPTION 'outbox_emit: schema {schema} has no CDC relay group, so no relay would read this message'
      USING ERRCODE = '55000', HINT = 'run outbox migrate --cdc for this schema';
  END IF;
  PERFORM pg_advisory_xact_lock_shared(hashtext('outbox-cdc-slot:' || slot));
  -- The columns PostgreSQL 16 and 17 added are read from one JSON image of the row (a column
  -- an older server lacks reads as NULL), built once per call: this runs in every emit.
  IF NOT EXISTS (
      SELECT 1 FROM pg_replication_slots AS s, LATERAL (SELECT to_jsonb(s) AS j) AS r
      WHERE s.slot_name = slot AND s.database = current_database()
        AND s.wal_status IS DISTINCT FROM 'lost'
        AND (r.j ->> 'invalidation_reason') IS NULL
        AND NOT coalesce((r.j ->> 'conflicting')::boolean, false)) THEN
    RAISE EXCEPTION 'outbox_emit: the CDC slot % is missing or lost, so this message would never be published', slot
      USING ERRCODE = '55000',
            HINT = 'the relay makes the slot again within seconds (docs/cdc.md, "When the slot is lost"); retry the transaction';
  END IF;
  doc := content::jsonb;
  IF jsonb_typeof(doc) <> 'object' THEN
    RAISE EXCEPTION 'outbox_emit: the message must be a JSON object of the outbox columns'
      USING ERRCODE = '22023';
  END IF;
  IF NOT doc ? 'id' THEN
    doc := doc || jsonb_build_object('id', {schema}.outbox_uuid_v7());
  END IF;
  RETURN pg_logical_emit_message(true,
    CASE WHEN '{schema}' = 'public' THEN 'outbox' ELSE 'outbox:{schema}' END, doc::text);
END
$$;
