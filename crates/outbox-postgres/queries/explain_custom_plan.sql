SET LOCAL plan_cache_mode = force_custom_plan
