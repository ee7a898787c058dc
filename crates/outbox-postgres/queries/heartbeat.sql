-- Registers or refreshes a member. $1 member
INSERT INTO {schema}.outbox_members (member, heartbeat_at) VALUES ($1, now())
ON CONFLICT (member) DO UPDATE SET heartbeat_at = now()
