SELECT MAX(TIMESTAMPDIFF(SECOND, trx_started, NOW())) FROM information_schema.INNODB_TRX
  WHERE trx_mysql_thread_id <> CONNECTION_ID()
