SELECT system_identifier::text, current_database()::text FROM pg_control_system()
