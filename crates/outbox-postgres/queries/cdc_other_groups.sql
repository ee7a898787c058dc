SELECT substr(name, length('cdc_start:') + 1)
  FROM {schema}.outbox_settings
  WHERE left(name, length('cdc_start:')) = 'cdc_start:'
  AND name <> $1
  ORDER BY name
