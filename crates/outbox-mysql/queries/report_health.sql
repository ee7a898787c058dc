UPDATE {schema}.outbox_members SET circuit = ?, sink_error = ? WHERE member = ?
