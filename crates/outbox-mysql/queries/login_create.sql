CREATE USER {user} IDENTIFIED BY '{password}'
