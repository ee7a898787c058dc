SELECT RELEASE_LOCK(CONCAT('outbox-maintain:', SHA1(?)))
