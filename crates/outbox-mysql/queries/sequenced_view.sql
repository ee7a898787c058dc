CREATE OR REPLACE ALGORITHM = MERGE VIEW {schema}.outbox_sequenced AS
SELECT o.seq, s.part, s.part_seq, o.id, o.aggregate_type, o.aggregate_id, o.event_type,
       o.payload, o.headers, o.topic, o.created_at
FROM {schema}.outbox_sequence AS s JOIN {schema}.outbox AS o ON o.seq = s.seq;
