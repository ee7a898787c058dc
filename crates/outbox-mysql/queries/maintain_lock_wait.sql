SET SESSION lock_wait_timeout = {secs}, innodb_lock_wait_timeout = {secs}
