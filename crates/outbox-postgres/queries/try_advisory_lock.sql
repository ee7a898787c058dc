SELECT pg_try_advisory_lock(hashtext($1))
