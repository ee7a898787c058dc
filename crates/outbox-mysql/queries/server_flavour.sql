SELECT @@version, CAST(@@log_bin AS SIGNED),
  CAST(@@log_bin_trust_function_creators AS SIGNED)
