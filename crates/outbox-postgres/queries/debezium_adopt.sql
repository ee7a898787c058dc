-- The copy trigger on a Debezium outbox table: each row inserted there is copied into the
-- outbox in the same transaction. Filled in by debezium.rs: {table} (the adopted table, quoted),
-- and the expressions built from its columns: {id}, {payload} and {headers}.
CREATE OR REPLACE FUNCTION {schema}.outbox_debezium_copy() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  INSERT INTO {schema}.outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
  VALUES ({id}, NEW.aggregatetype, NEW.aggregateid, NEW.type, {payload}, {headers});
  RETURN NULL;
END
$fn$;
DROP TRIGGER IF EXISTS outbox_relay_copy ON {table};
CREATE TRIGGER outbox_relay_copy AFTER INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {schema}.outbox_debezium_copy();
