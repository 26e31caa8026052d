-- Billing events (issue 47): a job's usage leaves through the event outbox as its own stream of
-- CloudEvents (started, in progress, completed, and a licence event for a provider's function).
--
-- The business model a job runs under (TRIAL, SUBSIDIZED or CONSUMPTION), decided at `run` as
-- the reference decides it; NULL for jobs from before this migration (read as TRIAL for a trial,
-- else SUBSIDIZED). Kept in its usage record too: it is what a licence is billed under.
ALTER TABLE jobs ADD COLUMN business_model TEXT;
ALTER TABLE job_usage ADD COLUMN business_model TEXT;
-- The job's usage events so far (their `sequence`: 1, 2, ... in the order they leave) and when
-- the last one was recorded (the next "in progress" event is due a period after it).
ALTER TABLE jobs ADD COLUMN usage_seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN usage_reported BIGINT;
-- Which stream an outbox row belongs to: `job` (the job's events, `sequence` its event number)
-- or `usage` (its usage events, `sequence` its `usage_seq`). Each stream of a job leaves in its
-- own order.
ALTER TABLE event_outbox ADD COLUMN stream TEXT NOT NULL DEFAULT 'job';
-- What the runner measured of the job while it ran, where it can (its cgroup under
-- `gantry serve`, else what its launcher's waited-for processes used): written before its
-- terminal move, which copies them into its usage record.
ALTER TABLE jobs ADD COLUMN cpu_used_ms BIGINT;
ALTER TABLE jobs ADD COLUMN memory_peak_bytes BIGINT;
