-- The trace a job belongs to (issue 31): the W3C `traceparent` (`00-<trace id>-<span id>-<flags>`)
-- of its `run` request's span, or the traceparent that request carried when spans are off.
-- Every later step of the job (status moves, deliveries, the FunctionJob, the pod, the
-- launcher, the function) starts its span as a child of it. NULL when neither existed.
ALTER TABLE jobs ADD COLUMN traceparent TEXT;
