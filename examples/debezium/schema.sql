-- Debezium's documented outbox table, as an application written for the Outbox Event Router
-- has it (the optional tracing column included). Run it in the schema the relay's outbox was
-- migrated into (its name must differ from the relay's `outbox`), then adopt it:
--   outbox migrate --schema myschema --adopt-debezium myschema.debezium_outbox
CREATE TABLE IF NOT EXISTS debezium_outbox (
    id                 uuid         NOT NULL PRIMARY KEY,
    aggregatetype      varchar(255) NOT NULL,
    aggregateid        varchar(255) NOT NULL,
    type               varchar(255) NOT NULL,
    payload            jsonb,
    tracingspancontext varchar(256)
);
