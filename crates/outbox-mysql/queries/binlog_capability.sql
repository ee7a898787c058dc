SET @mariadb_slave_capability = 4
