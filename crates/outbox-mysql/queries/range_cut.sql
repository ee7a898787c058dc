ALTER TABLE {schema}.{table}
  REORGANIZE PARTITION {catch_all} INTO ({ranges})
