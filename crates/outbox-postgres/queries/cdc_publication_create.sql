-- The group's publication ({publication}, a validated identifier): the message table only,
-- inserts only, as the root table so that segments come and go unseen.
CREATE PUBLICATION {publication} FOR TABLE {schema}.outbox
WITH (publish = 'insert', publish_via_partition_root = true)
