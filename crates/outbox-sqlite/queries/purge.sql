-- Deletes published rows older than the cutoff (maintain's retention). Pending and failed rows
-- are never touched.
DELETE FROM outbox WHERE state = 'published' AND published_at < ?1
