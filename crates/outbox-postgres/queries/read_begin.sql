BEGIN ISOLATION LEVEL READ COMMITTED, READ ONLY;
SET LOCAL jit = off;
SET LOCAL enable_bitmapscan = off;
SET LOCAL enable_sort = off
