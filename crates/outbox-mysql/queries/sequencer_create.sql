CREATE TABLE IF NOT EXISTS {schema}.outbox_sequencer (
    id              TINYINT      NOT NULL PRIMARY KEY,
    owner           VARCHAR(255) NULL,
    lease_until     DATETIME(6)  NOT NULL DEFAULT '1970-01-01 00:00:00',
    epoch           BIGINT       NOT NULL DEFAULT 0,
    beats           BIGINT       NOT NULL DEFAULT 0,
    binlog_file     VARCHAR(255) NULL,
    binlog_offset   BIGINT       NULL,
    sequenced_below BIGINT       NOT NULL DEFAULT 0,
    from_table      BIGINT       NOT NULL DEFAULT 0,
    trigger_rows_taken TINYINT   NOT NULL DEFAULT 0,
    updated_at      DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    server_identity VARCHAR(255) NULL,
    advanced_at     DATETIME(6)  NULL,
    reread_below    BIGINT       NULL,
    binlog_gtid     VARCHAR(1024) NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
INSERT IGNORE INTO {schema}.outbox_sequencer (id) VALUES (1);
