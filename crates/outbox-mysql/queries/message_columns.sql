o.seq, o.part, o.part_seq, CAST(o.id AS CHAR) AS id,
CAST(o.aggregate_type AS CHAR) AS aggregate_type,
CAST(o.aggregate_id AS CHAR) AS aggregate_id, CAST(o.event_type AS CHAR) AS event_type,
CAST(o.payload AS CHAR) AS payload, CAST(o.headers AS CHAR) AS headers,
CAST(o.topic AS CHAR) AS topic, o.created_at