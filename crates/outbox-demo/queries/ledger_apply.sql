-- Applies one payment to the balance. Runs in the handler's transaction, which also claims the
-- message in `processed_messages`: a redelivered payment finds its claim and is not applied
-- twice.
UPDATE balance SET payments = payments + 1, total_cents = total_cents + ?
