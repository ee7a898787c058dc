SELECT CAST(@@GLOBAL.binlog_checksum AS CHAR)
