DELETE FROM {schema}.outbox_members WHERE member = ?
