-- Forgets members silent for longer than a lease. ?1 cutoff: now - lease (unix ms)
DELETE FROM outbox_members WHERE heartbeat_at < ?1
