SELECT current_setting('server_version_num')::int
