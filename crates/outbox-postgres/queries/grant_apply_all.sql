-- Every recorded grant again, after the migrations of an `outbox migrate`; the rows are what
-- could not be given.
SELECT note FROM {schema}.outbox_apply_grants() AS note
