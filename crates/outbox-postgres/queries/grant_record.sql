-- Records a grant (`outbox migrate --grant PART=ROLE`) so that every later migration applies it
-- again. $1 the part, $2 the role.
INSERT INTO {schema}.outbox_grants (part, grantee) VALUES ($1, $2)
ON CONFLICT (part, grantee) DO NOTHING
