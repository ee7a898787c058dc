-- Graceful exit: forgets the membership. ?1 member
DELETE FROM outbox_members WHERE member = ?1
