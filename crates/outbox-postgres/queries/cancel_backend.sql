SELECT pg_cancel_backend($1)
