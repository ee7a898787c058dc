-- The statements that drop a throw-away login role and what it holds in this database (NULL when
-- there is no such role). $1 the role.
SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1::text)
            THEN format('DROP OWNED BY %I; DROP ROLE %I', $1::text, $1::text) END
