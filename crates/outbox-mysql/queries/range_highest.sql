SELECT part, MAX(part_seq) FROM {schema}.{table} PARTITION ({range}) GROUP BY part
