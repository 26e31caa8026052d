-- Which process or resource runs a job, as the compute backend names it ("pid:1234" for the
-- local runner, a FunctionJob name on Kubernetes). Lets a restarted gateway find, adopt or
-- reconcile jobs it started before.
ALTER TABLE jobs ADD COLUMN backend_ref TEXT;
-- Set when a user asked to stop a running job; the backend's answer moves it to STOPPED.
ALTER TABLE jobs ADD COLUMN stop_requested BOOLEAN NOT NULL DEFAULT FALSE;
