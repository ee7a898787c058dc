-- Counts the live members (run after reap_members). ?1 cutoff: now - lease (unix ms)
SELECT count(*) FROM outbox_members WHERE heartbeat_at >= ?1
