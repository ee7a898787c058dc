SET @slave_connect_state = ?
