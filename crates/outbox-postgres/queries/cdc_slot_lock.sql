SELECT pg_advisory_xact_lock(hashtext('outbox-cdc-slot:' || $1::text))
