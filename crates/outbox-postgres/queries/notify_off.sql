-- Removes the opt-in doorbell: writers commit without the NOTIFY lock; relays poll.
DROP TRIGGER IF EXISTS outbox_notify ON {schema}.outbox;
DROP FUNCTION IF EXISTS {schema}.outbox_notify();
