-- A member's circuit breaker state. ?1 member, ?2 circuit, ?3 sink error
UPDATE outbox_members SET circuit = ?2, sink_error = ?3 WHERE member = ?1
