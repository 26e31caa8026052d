-- A user's kept counts per status and creation day (issue 32): the count of a `created_after`
-- listing sums the whole days after its first one for the caller and status. The primary key
-- (author_id, program_id, status, day) served it by reading every row of the caller (every
-- function, status and day: 22,000 rows for a user with 800,000 jobs over two years); this
-- index reads that status's days alone. No `n` in it, so counter updates stay HOT.
--
-- On PostgreSQL the gateway builds this index with CREATE INDEX CONCURRENTLY before running
-- this migration (`db::indexes`), so writes go on while a big table is indexed; the statement
-- below then finds it built. SQLite builds it here.
CREATE INDEX IF NOT EXISTS job_counts_by_day_author_status_idx ON job_counts_by_day (author_id, status, day);
