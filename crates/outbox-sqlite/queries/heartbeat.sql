-- Registers or refreshes a member. ?1 member, ?2 now (unix ms)
INSERT INTO outbox_members (member, heartbeat_at) VALUES (?1, ?2)
ON CONFLICT (member) DO UPDATE SET heartbeat_at = excluded.heartbeat_at
