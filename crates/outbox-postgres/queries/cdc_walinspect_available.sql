-- Whether pg_walinspect is installed, whether it could be, and whether this login may install it.
SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_walinspect'),
       EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_walinspect'),
       (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
