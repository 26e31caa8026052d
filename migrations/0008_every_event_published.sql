-- Every job event goes through the outbox, not only status moves (sub-status changes, errors
-- sent by the function, the controller's LOG_LOST), so a job's published sequence is 1..n
-- without gaps and a consumer can tell a lost event by a gap.

-- The CloudEvents `type` of the row (`dev.gantry.job.status`, `dev.gantry.job.sub_status`, …);
-- the rows written before this migration were all status moves.
ALTER TABLE event_outbox ADD COLUMN event_type TEXT NOT NULL DEFAULT 'dev.gantry.job.status';

-- Whether the job's events are recorded in the outbox (set by the first one that is). An event
-- written where the sinks are not known (the controller's LOG_LOST) follows the job's earlier
-- events: in the outbox exactly when they were.
ALTER TABLE jobs ADD COLUMN outbox BOOLEAN NOT NULL DEFAULT FALSE;
UPDATE jobs SET outbox = TRUE WHERE id IN (SELECT job_id FROM event_outbox);
