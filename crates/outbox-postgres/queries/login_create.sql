-- The statement that creates a login role for a throw-away check (verify, tests), quoted by the
-- server. $1 the role, $2 its password.
SELECT format('CREATE ROLE %I LOGIN PASSWORD %L', $1::text, $2::text)
