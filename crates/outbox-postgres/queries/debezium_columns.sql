SELECT column_name::text, data_type::text
  FROM information_schema.columns
  WHERE table_schema = $1
  AND table_name = $2
  ORDER BY ordinal_position
