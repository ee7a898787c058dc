-- Refreshes the heartbeat of a member that is still registered (renew never re-registers a
-- released member). ?1 member, ?2 now (unix ms)
UPDATE outbox_members SET heartbeat_at = ?2 WHERE member = ?1
