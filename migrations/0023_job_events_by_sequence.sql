-- One index of a job's events, not three (issue 32: `run` no slower than before the kept counts).
-- Every read of events names one job and walks its events by sequence number (the listing, the
-- stream's resume, the job-time lookup, retention's deletes), which `job_events_job_seq_idx`
-- (0005) serves; the two indexes by creation time (0001) were read by nothing since 0005, yet
-- every event (one per `run`, one per move) added an entry to each.
DROP INDEX IF EXISTS job_events_job_created_idx;
DROP INDEX IF EXISTS job_events_job_type_created_idx;
