-- The sequence's high-water mark: every seq drawn so far is at most this. Read in a statement of
-- its own, before the window claim's snapshot is taken, it is a floor for that snapshot: every
-- row of a transaction that gets its id after the snapshot has a larger seq (see claim_window).
SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END
FROM {schema}.outbox_seq_v2 AS s
