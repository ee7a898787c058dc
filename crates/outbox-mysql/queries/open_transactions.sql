SELECT CAST(trx_mysql_thread_id AS UNSIGNED),
  CASE WHEN trx_rows_modified > 0 OR trx_state <> 'RUNNING'
       OR (trx_query IS NOT NULL
           AND trx_query NOT REGEXP '^[[:space:]]*(SELECT|SHOW)[[:space:]]')
  THEN CONCAT(trx_mysql_thread_id, '@', trx_started) END
  FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id <> CONNECTION_ID()
