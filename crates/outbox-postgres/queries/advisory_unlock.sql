SELECT pg_advisory_unlock(hashtext($1))
