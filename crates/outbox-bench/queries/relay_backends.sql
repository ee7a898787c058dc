-- The server processes of the relay under test: its pool sets an application_name of its own,
-- so idle mode can add up their CPU apart from every other session's.
SELECT pid FROM pg_stat_activity WHERE application_name = $1
