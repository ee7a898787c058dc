SELECT CAST(@@GLOBAL.log_bin_compress AS SIGNED)
