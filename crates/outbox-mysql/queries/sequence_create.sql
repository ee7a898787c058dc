CREATE TABLE IF NOT EXISTS {schema}.outbox_sequence (
    seq      BIGINT   NOT NULL PRIMARY KEY,
    part     SMALLINT NOT NULL,
    part_seq BIGINT   NOT NULL,
    KEY outbox_sequence_position (part, part_seq)
) ENGINE = InnoDB {partitioning}
