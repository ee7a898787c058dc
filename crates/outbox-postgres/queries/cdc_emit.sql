SELECT {schema}.outbox_emit($1)::text
