-- Payments applied and their total, for the summary's comparison with what was committed.
SELECT payments, total_cents FROM balance
