SELECT CAST(@@GLOBAL.log_bin AS SIGNED), CAST(@@GLOBAL.binlog_format AS CHAR),
  CAST(@@GLOBAL.binlog_row_image AS CHAR)
