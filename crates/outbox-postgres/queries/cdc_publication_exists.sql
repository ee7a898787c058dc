SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)
