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
--
-- This runs in every emit, so what can be known at `outbox migrate --cdc` is spliced in then
-- (setup.rs): `{slot}`, the group's slot (a validated identifier), and `{slot_valid}`, the test
-- of a valid slot written for the server's major version (PostgreSQL 16 added `conflicting`, 17
-- `invalidation_reason`). Looking both up at each call cost 45 of its 75 µs (run `outbox
-- migrate --cdc` again after a major upgrade, as docs/cdc.md says).
CREATE OR REPLACE FUNCTION {schema}.outbox_emit(content text) RETURNS pg_lsn
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  doc jsonb;
BEGIN
  PERFORM pg_advisory_xact_lock_shared(hashtext('outbox-cdc-slot:{slot}'));
  IF NOT EXISTS (
      SELECT 1 FROM pg_replication_slots AS s
      WHERE s.slot_name = '{slot}' AND s.database = current_database() AND {slot_valid}) THEN
    RAISE EXCEPTION 'outbox_emit: the CDC slot {slot} is missing or lost, so this message would never be published'
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
