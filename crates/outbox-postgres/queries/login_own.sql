-- The statements that let a login own an outbox as docs/roles.md has it: create its schema in
-- this database and, where the caller is a superuser, replicate (CDC mode's slot). $1 the role.
SELECT format('GRANT CREATE ON DATABASE %I TO %I', current_database(), $1::text)
       || CASE WHEN (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
               THEN format('; ALTER ROLE %I REPLICATION', $1::text) ELSE '' END
