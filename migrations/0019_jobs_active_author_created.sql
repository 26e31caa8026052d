-- A user's unfinished jobs in creation order from the index (issue 32): `jobs/queue/` lists the
-- caller's oldest unfinished jobs; `jobs_active_author_idx` (author_id) found them but not in
-- order, so the planner walked the caller's whole history oldest first instead and read every
-- job on the way (500 rows for the 100 oldest unfinished of the 10 M scale seed's heaviest
-- user, 11 ms). With the creation time and id in the partial index, the first 100 entries are
-- the answer.
--
-- On PostgreSQL the gateway builds this index with CREATE INDEX CONCURRENTLY before running
-- this migration (`db::indexes`); the statement below then finds it built. SQLite builds it
-- here. The index it replaces goes (a short lock).
CREATE INDEX IF NOT EXISTS jobs_active_author_created_idx ON jobs (author_id, created, id) WHERE status IN ('QUEUED','PENDING','RUNNING');
DROP INDEX IF EXISTS jobs_active_author_idx;
