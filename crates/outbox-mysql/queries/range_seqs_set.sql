UPDATE {schema}.outbox_settings SET value = ? WHERE name = 'range_seqs'
