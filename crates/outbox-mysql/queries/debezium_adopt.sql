CREATE TRIGGER `{db}`.{trigger} AFTER INSERT ON `{db}`.`{table}` FOR EACH ROW
INSERT INTO `{schema}`.outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
VALUES (NEW.id, NEW.aggregatetype, NEW.aggregateid, NEW.type,
        COALESCE(NEW.payload, 'null'), {headers})
