-- outbox schema, version 7: `seq` is drawn by a plain `nextval` default, no longer by an identity.
--
-- The rewriter finds an identity column's sequence by scanning `pg_depend` (`getIdentitySequence`,
-- no cache) every time it expands an INSERT's defaults: every INSERT a client sends without
-- reusing a prepared plan (psql, pgbench, PHP's PDO with emulated prepares, most ORMs' one-off
-- statements). A profile of one backend running the plainest four-column insert through pgbench
-- put that scan at 10.8 µs of a 208 µs transaction, a third of all the outbox cost over the naive
-- table. A `nextval('…'::regclass)` default is read from the table's cached defaults instead.
--
-- What the identity also gave, refusing a `seq` written by hand unless `OVERRIDING SYSTEM VALUE`,
-- is now the SQL contract's rule (never write `seq`, as already for `txid`); a row written that
-- way below a relay's floor is found by the relay's floor audit, which warns.
--
-- The sequence keeps its name, its last value and CACHE 1 (claims read its last value as a
-- floor, see 0005): the identity's sequence is dropped with the identity, so a new one takes
-- over exactly where it stopped. The table's lock comes first (the order writers take them:
-- the table, then the sequence), then `ALTER SEQUENCE` takes one that waits for every other
-- transaction that has drawn from it (CDC parking calls nextval without touching the table) and
-- holds off new ones until this migration commits, so no value is handed out twice.
--
-- The identity's sequence is dropped with its privileges, and a `nextval` default needs USAGE
-- where an identity needed none: the new sequence gets the old one's owner (the table's, which
-- `OWNED BY` requires) and its grants, and USAGE for every role that may insert into the table,
-- so a least-privilege writer or relay keeps working after the upgrade (docs/roles.md).
DO $$
DECLARE
  last_value bigint;
  called boolean;
  old_acl aclitem[];
  owner regrole;
  g record;
BEGIN
  IF EXISTS (SELECT 1 FROM pg_attribute
             WHERE attrelid = '{schema}.outbox'::regclass AND attname = 'seq'
               AND attidentity <> '') THEN
    LOCK TABLE {schema}.outbox IN ACCESS EXCLUSIVE MODE;
    ALTER SEQUENCE {schema}.outbox_seq_v2 CACHE 1;
    SELECT s.last_value, s.is_called INTO last_value, called FROM {schema}.outbox_seq_v2 AS s;
    SELECT relacl INTO old_acl FROM pg_class WHERE oid = '{schema}.outbox_seq_v2'::regclass;
    SELECT relowner::regrole INTO owner FROM pg_class WHERE oid = '{schema}.outbox'::regclass;
    ALTER TABLE {schema}.outbox ALTER COLUMN seq DROP IDENTITY;
    CREATE SEQUENCE {schema}.outbox_seq_v2 AS bigint INCREMENT 1 CACHE 1 NO CYCLE;
    EXECUTE format('ALTER SEQUENCE {schema}.outbox_seq_v2 OWNER TO %s', owner);
    ALTER SEQUENCE {schema}.outbox_seq_v2 OWNED BY {schema}.outbox.seq;
    PERFORM setval('{schema}.outbox_seq_v2', last_value, called);
    FOR g IN
      SELECT a.privilege_type, a.grantee
      FROM aclexplode(old_acl) AS a
      WHERE a.grantee <> (SELECT relowner FROM pg_class WHERE oid = '{schema}.outbox'::regclass)
    UNION
      SELECT 'USAGE', a.grantee
      FROM pg_class AS c, aclexplode(c.relacl) AS a
      WHERE c.oid = '{schema}.outbox'::regclass AND a.privilege_type = 'INSERT'
    UNION
      SELECT DISTINCT 'USAGE', a.grantee
      FROM pg_attribute AS t, aclexplode(t.attacl) AS a
      WHERE t.attrelid = '{schema}.outbox'::regclass AND t.attacl IS NOT NULL
        AND a.privilege_type = 'INSERT'
    LOOP
      EXECUTE format('GRANT %s ON SEQUENCE {schema}.outbox_seq_v2 TO %s', g.privilege_type,
                     CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END);
    END LOOP;
    ALTER TABLE {schema}.outbox
      ALTER COLUMN seq SET DEFAULT nextval('{schema}.outbox_seq_v2'::regclass);
  END IF;
END
$$;
