-- Retention of finished jobs (`--retain-finished-days`, `gantry admin gc`): finished jobs by their
-- last update, oldest first, so each batch reads only the jobs it deletes. The predicate is the
-- exact text of the retention queries' status filter (SQLite uses a partial index only then).
CREATE INDEX jobs_finished_updated_idx ON jobs (updated, id) WHERE status IN ('SUCCEEDED', 'FAILED', 'STOPPED');
