CAST(EXISTS (SELECT 1 FROM {schema}.outbox_parked AS q
             WHERE q.part = o.part AND q.aggregate_id = o.aggregate_id {skip}) AS SIGNED)
