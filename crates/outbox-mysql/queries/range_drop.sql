ALTER TABLE {schema}.{table} DROP PARTITION {range}
