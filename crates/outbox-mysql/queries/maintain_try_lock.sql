SELECT GET_LOCK(CONCAT('outbox-maintain:', SHA1(?)), 0)
