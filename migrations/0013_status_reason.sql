-- Why a job ended (issue 30): the reason of its terminal status move (the `reason` of that
-- STATUS_CHANGE event), kept on the job so `jobs/{id}/` and the listings answer it without
-- reading events. NULL for a success and for jobs that ended before this column.
ALTER TABLE jobs ADD COLUMN status_reason TEXT;
