-- The ledger consumer's running balance, one row, in its own SQLite database beside its inbox:
-- what the inbox processor's handler updates once per payment.
CREATE TABLE balance (payments INTEGER NOT NULL, total_cents INTEGER NOT NULL);
INSERT INTO balance VALUES (0, 0);
