-- Effects written so far: the processor must have written exactly one per message.
SELECT count(*) FROM {schema}.bench_effects
