SET LOCAL statement_timeout = '10s'
