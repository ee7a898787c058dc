SELECT EXISTS (SELECT 1 FROM pg_trigger AS t
               JOIN pg_class AS c ON c.oid = t.tgrelid
               JOIN pg_namespace AS n ON n.oid = c.relnamespace
               WHERE n.nspname = $1 AND c.relname = 'outbox' AND t.tgname = 'outbox_notify')
