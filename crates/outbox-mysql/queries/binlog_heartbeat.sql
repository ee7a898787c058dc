SET @master_heartbeat_period = {nanos}
