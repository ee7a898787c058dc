SELECT CAST(fingerprint AS CHAR) AS fingerprint, CAST(result AS CHAR) AS result, CAST(events AS CHAR) AS events FROM {schema}.idempotency_keys WHERE `key` = ? LOCK IN SHARE MODE
