-- Event streams: every job event gets a per-job sequence number (the resume point of
-- `events/stream/`), and status moves are recorded in an outbox in the same transaction, for the
-- outbound sinks (NATS JetStream, webhooks) to deliver at least once, in order per job.

-- The last sequence number given to one of the job's events. Every event insert updates the job
-- row first, so the row lock (PostgreSQL) or the single writer (SQLite) orders them.
ALTER TABLE jobs ADD COLUMN event_seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE job_events ADD COLUMN seq BIGINT NOT NULL DEFAULT 0;

-- Existing events are numbered in the order they were listed in: creation time, then id.
UPDATE job_events SET seq = (
    SELECT COUNT(*) FROM job_events e
    WHERE e.job_id = job_events.job_id
      AND (e.created < job_events.created OR (e.created = job_events.created AND e.id <= job_events.id)));
UPDATE jobs SET event_seq = (SELECT COUNT(*) FROM job_events e WHERE e.job_id = jobs.id);
CREATE INDEX job_events_job_seq_idx ON job_events (job_id, seq);

CREATE TABLE event_outbox (
    -- The CloudEvent id (a UUID): also NATS's de-duplication id.
    id           TEXT PRIMARY KEY,
    -- No foreign key: an event stays deliverable after its job is deleted.
    job_id       TEXT NOT NULL,
    -- The job event's sequence number: delivery order within one job.
    seq          BIGINT NOT NULL,
    created      BIGINT NOT NULL,
    -- The CloudEvent `data` member, as JSON text.
    data         TEXT NOT NULL,
    -- Comma-separated names of the sinks that accepted the event so far.
    delivered_to TEXT NOT NULL DEFAULT '',
    -- When every sink had accepted it.
    delivered    BIGINT,
    -- When delivery was given up; the row is kept with its error.
    failed       BIGINT,
    attempts     BIGINT NOT NULL DEFAULT 0,
    last_error   TEXT,
    -- Not retried before this time (backoff).
    next_attempt BIGINT NOT NULL DEFAULT 0
);
-- The publisher's queue: undelivered rows, oldest first.
CREATE INDEX event_outbox_pending_idx ON event_outbox (created, job_id, seq) WHERE delivered IS NULL AND failed IS NULL;
-- Pruning: the oldest delivered rows.
CREATE INDEX event_outbox_delivered_idx ON event_outbox (delivered) WHERE delivered IS NOT NULL;
