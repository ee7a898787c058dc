-- Debezium's documented outbox table on MySQL/MariaDB, as an application written for the
-- Outbox Event Router has it. Run it in the outbox's database, then adopt it:
--   outbox migrate --database-url mysql://…/db --adopt-debezium db.debezium_outbox
CREATE TABLE IF NOT EXISTS debezium_outbox (
    id                 VARCHAR(36)  NOT NULL PRIMARY KEY,
    aggregatetype      VARCHAR(255) NOT NULL,
    aggregateid        VARCHAR(255) NOT NULL,
    type               VARCHAR(255) NOT NULL,
    payload            JSON,
    tracingspancontext VARCHAR(256)
) ENGINE = InnoDB;
