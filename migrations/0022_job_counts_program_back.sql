-- Counter updates HOT again (issue 32): 0018 put `n` in the functions' index of the kept counts
-- so a provider's count read the index alone; the price was that every counter update changed
-- an indexed column, so none was a HOT update: each run and each move added entries to this
-- index and the primary key, which (until vacuumed) every later count of that user walks.
-- Since 0021 a provider's count reads its own rows; the functions' index is back to what it was
-- (a function's count or a few functions' read their rows from the heap, tens of rows).
--
-- On PostgreSQL the gateway builds this index with CREATE INDEX CONCURRENTLY before running
-- this migration (`db::indexes`); the statement below then finds it built. SQLite builds it
-- here. The index it replaces goes (a short lock).
CREATE INDEX IF NOT EXISTS job_counts_program_idx ON job_counts (program_id, status);
DROP INDEX IF EXISTS job_counts_program_n_idx;
