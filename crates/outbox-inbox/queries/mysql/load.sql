SELECT CAST(id AS CHAR) AS id, CAST(source AS CHAR) AS source, CAST(type AS CHAR) AS type,
       CAST(`key` AS CHAR) AS `key`, CAST(payload AS CHAR) AS payload,
       CAST(payload_format AS CHAR) AS payload_format, CAST(headers AS CHAR) AS headers,
       CAST(source_position AS CHAR) AS source_position, received_at
FROM {schema}.inbox_messages WHERE id IN (
