SELECT to_regclass(format('%I.outbox_migrations', $1::text))::text
