-- Sessions of this database, other than ours, holding a snapshot taken more than 5 s ago: they
-- pin the xmin horizon as idle-tx mode's held transaction does, in both of its runs, so the
-- report names them.
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND backend_xmin IS NOT NULL AND xact_start < now() - interval '5 seconds'
