SET LOCAL statement_timeout = 0
