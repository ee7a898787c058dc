-- Gives one part's privileges to one role (migration 8's `outbox_apply_grant`); the rows are
-- what the caller must still do by hand. $1 the part, $2 the role.
SELECT note FROM {schema}.outbox_apply_grant($1, $2) AS note
