-- Accounts 1..$1, as `pgbench -i` fills them.
INSERT INTO {schema}.accounts (id) SELECT generate_series(1, $1)
