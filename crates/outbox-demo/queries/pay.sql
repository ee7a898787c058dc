-- One payment row; its `payment.created` event is enqueued in the same transaction, so both
-- commit or neither does.
INSERT INTO {schema}.payments (id, amount_cents) VALUES ($1, $2)
