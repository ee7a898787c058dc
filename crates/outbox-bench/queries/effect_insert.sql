-- A handler's effect: one row per handled message ($1 message id, $2 ordering key).
INSERT INTO {schema}.bench_effects (message_id, key) VALUES ($1, $2)
