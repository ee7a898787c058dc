DROP TRIGGER IF EXISTS outbox_relay_copy ON {table};
DROP FUNCTION IF EXISTS {schema}.outbox_debezium_copy();
