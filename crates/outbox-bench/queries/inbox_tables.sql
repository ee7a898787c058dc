-- Inbox mode's own tables beside the inbox: the effect every handler writes (one row per
-- message, counted afterwards), and the naive consumer's inbox, keyed by message id so a
-- redelivery is absorbed by the primary key.
CREATE TABLE {schema}.bench_effects (message_id uuid NOT NULL, key text NOT NULL);
CREATE TABLE {schema}.naive_inbox (id uuid PRIMARY KEY, key text NOT NULL,
                                   received_at timestamptz NOT NULL DEFAULT now());
