-- A backfill job preempted by a tenant reclaiming its guarantee is queued again when its
-- function allows retries after start (issue 48), at most `lifecycle::MAX_REQUEUES` times:
-- `requeues` counts them. `carried_run_us` is the run time of its earlier runs (microseconds),
-- kept while it waits: its next move into RUNNING (or its ending while queued) sets
-- `running_since` that much earlier, so its usage record's run time is the sum of its runs and
-- its wait the sum of its waits; its current run started at `running_since + carried_run_us`
-- (what a reclaim's grace counts from).
ALTER TABLE jobs ADD COLUMN requeues BIGINT NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN carried_run_us BIGINT NOT NULL DEFAULT 0;
