SELECT EXISTS (SELECT 1 FROM {schema}.outbox_parked WHERE seq >= ? AND seq < ?)
