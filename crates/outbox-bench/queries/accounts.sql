-- Writers mode's business table, shaped like pgbench's `pgbench_accounts`: integer key,
-- balance, 84 bytes of filler, so each business UPDATE touches a row of a realistic width.
CREATE TABLE {schema}.accounts (
    id      integer  PRIMARY KEY,
    balance bigint   NOT NULL DEFAULT 0,
    filler  char(84) NOT NULL DEFAULT ''
)
