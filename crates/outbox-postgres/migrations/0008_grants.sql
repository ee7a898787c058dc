-- outbox schema, version 8: the least privileges of each part, recorded and kept.
--
-- `outbox migrate --grant PART=ROLE` records a grant here and applies it; every later
-- `outbox migrate` applies every recorded grant again after its migrations, so a migration that
-- recreates an object (as version 7 recreated the sequence) can never leave a role without what
-- it had. docs/roles.md says what each part may do and why.
CREATE TABLE IF NOT EXISTS {schema}.outbox_grants (
    part       text        NOT NULL CHECK (part IN ('writer', 'relay', 'operator', 'reader')),
    grantee    text        NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (part, grantee)
);

-- Applies one part's privileges to one role, idempotently (GRANT is a no-op when held). Objects
-- that exist only in some setups (CDC mode's `outbox_emit`) are granted when present. Returns
-- what the caller should know (a privilege it could not give, and how to give it).
CREATE OR REPLACE FUNCTION {schema}.outbox_apply_grant(part text, grantee text)
RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
  r text := quote_ident(grantee);
  owner regrole := (SELECT relowner::regrole FROM pg_class WHERE oid = '{schema}.outbox'::regclass);
  cdc boolean := EXISTS (SELECT 1 FROM {schema}.outbox_settings WHERE name LIKE 'cdc_start:%');
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = grantee) THEN
    RAISE EXCEPTION 'role "%" does not exist', grantee
      USING HINT = format('CREATE ROLE %s LOGIN (with a password or a certificate), then run outbox migrate --grant %s=%s again', r, part, grantee);
  END IF;
  EXECUTE format('GRANT USAGE ON SCHEMA {schema} TO %s', r);
  IF part = 'writer' THEN
    -- Its own columns only: `seq`, `txid` and `partition` are the engine's, and a hand-written
    -- `seq` would put a row where no claim reads it.
    EXECUTE format('GRANT INSERT (id, aggregate_type, aggregate_id, event_type, payload, headers, topic, created_at) ON {schema}.outbox TO %s', r);
    -- `INSERT … RETURNING id`: the id the database made for a row written without one.
    EXECUTE format('GRANT SELECT (id) ON {schema}.outbox TO %s', r);
    EXECUTE format('GRANT USAGE ON SEQUENCE {schema}.outbox_seq_v2 TO %s', r);
    EXECUTE format('GRANT EXECUTE ON FUNCTION {schema}.outbox_uuid_v7() TO %s', r);
    IF to_regprocedure('{schema}.outbox_emit(text)') IS NOT NULL THEN
      EXECUTE format('GRANT EXECUTE ON FUNCTION {schema}.outbox_emit(text) TO %s', r);
    END IF;
  ELSIF part IN ('relay', 'operator', 'reader') THEN
    EXECUTE format('GRANT SELECT ON {schema}.outbox, {schema}.outbox_positions, {schema}.outbox_parked, {schema}.outbox_partitions, {schema}.outbox_members, {schema}.outbox_segments, {schema}.outbox_settings, {schema}.outbox_redrives, {schema}.outbox_migrations, {schema}.outbox_grants TO %s', r);
    EXECUTE format('GRANT SELECT ON SEQUENCE {schema}.outbox_seq_v2 TO %s', r);
    EXECUTE format('GRANT EXECUTE ON FUNCTION {schema}.outbox_seq_floor() TO %s', r);
    IF part = 'relay' THEN
      EXECUTE format('GRANT INSERT, UPDATE, DELETE ON {schema}.outbox_positions, {schema}.outbox_parked, {schema}.outbox_partitions, {schema}.outbox_members TO %s', r);
      EXECUTE format('GRANT INSERT, UPDATE ON {schema}.outbox_settings TO %s', r);
      -- CDC mode parks with a fresh seq.
      EXECUTE format('GRANT USAGE ON SEQUENCE {schema}.outbox_seq_v2 TO %s', r);
      -- Segments are created ahead of the writers and dropped once passed: ATTACH and DETACH
      -- CONCURRENTLY need the table's owner, so the relay is a member of the owner role. A
      -- superuser owner is not handed out: migrate as a role of its own (docs/roles.md).
      IF (SELECT rolsuper FROM pg_roles WHERE oid = owner) THEN
        RETURN NEXT format('relay %s: segment maintenance needs the privileges of the outbox tables'' owner, %s, a superuser, which this command does not grant: let a role of its own own them (ALTER TABLE … OWNER TO, see docs/roles.md), or run `outbox maintain` as the owner on a schedule and start relays with --maintain-every 0', grantee, owner);
      ELSIF owner::text <> quote_ident(grantee) AND NOT pg_has_role(grantee, owner, 'MEMBER') THEN
        IF pg_has_role(current_user, owner, 'MEMBER WITH ADMIN OPTION') THEN
          EXECUTE format('GRANT %s TO %s', owner, r);
        ELSE
          RETURN NEXT format('relay %s: segment maintenance needs the privileges of the outbox tables'' owner; a superuser (or a role with ADMIN OPTION on it) must run: GRANT %s TO %s', grantee, owner, r);
        END IF;
      END IF;
      IF cdc THEN
        IF NOT (SELECT rolreplication FROM pg_roles WHERE rolname = grantee) THEN
          IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
            EXECUTE format('ALTER ROLE %s REPLICATION', r);
          ELSE
            RETURN NEXT format('relay %s: CDC mode reads the WAL by replication, which needs the REPLICATION attribute that only a superuser gives: ALTER ROLE %s REPLICATION', grantee, r);
          END IF;
        END IF;
        -- Its barriers and heartbeats are logical messages (docs/roles.md: PUBLIC may lose
        -- that function), and a lost slot's emit messages are read back with pg_walinspect.
        IF has_function_privilege('pg_logical_emit_message(boolean, text, text)', 'EXECUTE WITH GRANT OPTION')
           OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
          EXECUTE format('GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) TO %s', r);
        END IF;
        IF to_regprocedure('pg_get_wal_records_info(pg_lsn, pg_lsn)') IS NOT NULL THEN
          IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s',
                           to_regprocedure('pg_get_wal_records_info(pg_lsn, pg_lsn)'), r);
          ELSIF NOT has_function_privilege(grantee, 'pg_get_wal_records_info(pg_lsn, pg_lsn)', 'EXECUTE') THEN
            RETURN NEXT format('relay %s: reading back the emit messages of a lost slot needs pg_walinspect, which a superuser grants: GRANT EXECUTE ON FUNCTION pg_get_wal_records_info(pg_lsn, pg_lsn) TO %s', grantee, r);
          END IF;
        END IF;
      END IF;
    ELSIF part = 'operator' THEN
      -- Redrive: a failed message back to retrying, and its audit row.
      EXECUTE format('GRANT UPDATE ON {schema}.outbox_parked TO %s', r);
      EXECUTE format('GRANT INSERT ON {schema}.outbox_redrives TO %s', r);
    END IF;
  END IF;
END
$$;

-- Every recorded grant again (after each `outbox migrate`), with what could not be given.
CREATE OR REPLACE FUNCTION {schema}.outbox_apply_grants()
RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
  g record;
BEGIN
  FOR g IN SELECT part, grantee FROM {schema}.outbox_grants ORDER BY part, grantee LOOP
    RETURN QUERY SELECT * FROM {schema}.outbox_apply_grant(g.part, g.grantee);
  END LOOP;
END
$$;

-- A schema upgraded to version 7 before that migration carried grants over has a sequence
-- nobody but its owner may use: every role that may insert into the table gets USAGE on it
-- again (an identity needed none, a `nextval` default does).
DO $$
DECLARE
  g record;
BEGIN
  FOR g IN
    SELECT DISTINCT a.grantee
    FROM pg_class AS c, aclexplode(c.relacl) AS a
    WHERE c.oid = '{schema}.outbox'::regclass AND a.privilege_type = 'INSERT'
  UNION
    SELECT DISTINCT a.grantee
    FROM pg_attribute AS t, aclexplode(t.attacl) AS a
    WHERE t.attrelid = '{schema}.outbox'::regclass AND t.attacl IS NOT NULL
      AND a.privilege_type = 'INSERT'
  LOOP
    EXECUTE format('GRANT USAGE ON SEQUENCE {schema}.outbox_seq_v2 TO %s',
                   CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END);
  END LOOP;
  -- Roles that read the positions (relays, `outbox status`) read the claims' floor from the
  -- sequence (`pg_sequence_last_value` needs SELECT on it).
  FOR g IN
    SELECT DISTINCT a.grantee
    FROM pg_class AS c, aclexplode(c.relacl) AS a
    WHERE c.oid = '{schema}.outbox_positions'::regclass AND a.privilege_type = 'SELECT'
  LOOP
    EXECUTE format('GRANT SELECT ON SEQUENCE {schema}.outbox_seq_v2 TO %s',
                   CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END);
  END LOOP;
END
$$;
