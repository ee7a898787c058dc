SELECT CAST(column_name AS CHAR), CAST(data_type AS CHAR) FROM information_schema.columns
  WHERE table_schema = ? AND table_name = ? ORDER BY ordinal_position
