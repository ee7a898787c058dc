-- outbox tables, version 3: the messages kept in ranges of `seq` (table partitions), so that
-- retention drops a range whole (`ALTER TABLE … DROP PARTITION`) and never deletes rows: no
-- delete-marked records for index scans to walk, no purge lag, no history list to grow.
-- See docs/engine-mysql.md, "Retention". Every statement can be run again.

-- Settings of this outbox, in numbers.
CREATE TABLE IF NOT EXISTS {schema}.outbox_settings (
    name  VARCHAR(64) NOT NULL PRIMARY KEY,
    value BIGINT      NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- How many seqs a range spans; maintenance keeps two ranges ready beyond the last seq. A change
-- applies to the ranges made after it.
INSERT IGNORE INTO {schema}.outbox_settings (name, value) VALUES ('range_seqs', 10000000);

-- No message can appear below this seq any more: every transaction that drew one had ended
-- when maintenance last looked (its seal; see docs/engine-mysql.md). Only ever raised.
INSERT IGNORE INTO {schema}.outbox_settings (name, value) VALUES ('sealed_below', 0);

-- Every message below this seq lies in a range that no writer can add to any more and that
-- every partition's position has passed (maintenance moves it up, never down). Claims read
-- only at or above it, so the ranges retention keeps are never probed.
INSERT IGNORE INTO {schema}.outbox_settings (name, value) VALUES ('passed_below', 0);

-- The first range holds the rows already written (none on a new outbox); the catch-all
-- `s_max` takes any seq past the last range, so a writer never fails for want of a range, and
-- maintenance cuts ranges out of it while it is still empty. This rebuilds the table once,
-- copying its rows: on an outbox that already holds many, migrate at a quiet time.
SET @outbox_first_range = (SELECT COALESCE(MAX(seq), 0) + 1 FROM {schema}.outbox);
SET @outbox_ranges = CONCAT(
    'ALTER TABLE {schema}.outbox PARTITION BY RANGE (seq) (PARTITION s', @outbox_first_range,
    ' VALUES LESS THAN (', @outbox_first_range, '), PARTITION s_max VALUES LESS THAN MAXVALUE)');
PREPARE outbox_ranges FROM @outbox_ranges;
EXECUTE outbox_ranges;
DEALLOCATE PREPARE outbox_ranges;
