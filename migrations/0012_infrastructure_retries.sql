-- Retries of what the infrastructure broke (`gantry controller --infrastructure-retries`):
-- `programs.retry_after_start` is the function's opt-in (upload field `retry_after_start`) to be
-- started again when the cluster ends its pod after its code started, since a rerun may repeat
-- paid quantum work; `jobs.infrastructure_retries` counts the times the job was started again
-- on a new pod, the compare-and-set that records each retry once (with its `RETRY` job event).
ALTER TABLE programs ADD COLUMN retry_after_start BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE jobs ADD COLUMN infrastructure_retries BIGINT NOT NULL DEFAULT 0;
