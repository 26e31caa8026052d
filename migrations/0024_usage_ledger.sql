-- The usage ledger (issue 47).
--
-- What a job is metered from, kept on the job: when it first moved into RUNNING
-- (`running_since`: its run time goes from then to its end; an infrastructure retry starts a new
-- pod but the job keeps its status and its slot, so every attempt lies inside that interval),
-- the instance it ran for (its run's `Service-CRN`), and what its runner gave it, written when
-- the runner starts it: its size's compute profile, CPU in thousandths of a core, memory in MiB,
-- GPUs and their model. NULL for jobs from before this migration and jobs never started.
ALTER TABLE jobs ADD COLUMN running_since BIGINT;
ALTER TABLE jobs ADD COLUMN instance TEXT;
ALTER TABLE jobs ADD COLUMN compute_profile TEXT;
ALTER TABLE jobs ADD COLUMN allocated_cpu_millis BIGINT;
ALTER TABLE jobs ADD COLUMN allocated_memory_mib BIGINT;
ALTER TABLE jobs ADD COLUMN allocated_gpus BIGINT;
ALTER TABLE jobs ADD COLUMN allocated_gpu_model TEXT;

-- One record per ended job, written in the transaction of its terminal move (whatever ended it:
-- success, failure, stop, timeout, lost): who it belongs to, how long it waited (created to
-- RUNNING, or to its end when it never ran) and ran (RUNNING to its end), in milliseconds, the
-- attempts it took (1 + its infrastructure retries), what it ran with and the allocation over
-- its run time: core-milliseconds, MiB-milliseconds / 1024 (GiB-milliseconds) and
-- GPU-milliseconds. `cpu_used_ms` and `memory_peak_bytes` are what the runner measured, where it
-- can (a job's cgroup under `gantry serve`), else NULL. Records outlive their jobs' retention:
-- they are what is billed.
CREATE TABLE job_usage (
    job_id            TEXT PRIMARY KEY,
    author_id         TEXT NOT NULL,
    program_id        TEXT NOT NULL,
    provider_id       TEXT,
    trial             BOOLEAN NOT NULL,
    instance          TEXT,
    function_size     TEXT,
    compute_profile   TEXT,
    status            TEXT NOT NULL,
    created           BIGINT NOT NULL,
    ended             BIGINT NOT NULL,
    wait_ms           BIGINT NOT NULL,
    run_ms            BIGINT NOT NULL,
    attempts          BIGINT NOT NULL,
    cpu_millis        BIGINT,
    memory_mib        BIGINT,
    gpus              BIGINT,
    gpu_model         TEXT,
    cpu_core_ms       BIGINT NOT NULL,
    gib_ms            BIGINT NOT NULL,
    gpu_ms            BIGINT NOT NULL,
    cpu_used_ms       BIGINT,
    memory_peak_bytes BIGINT
);
CREATE INDEX job_usage_ended_idx ON job_usage (ended);

-- The records summed per day of their end, user, function and size, in the same transaction:
-- `GET usage/` reads a user's (or, by `provider_id`, a provider's; by `program_id`, a function's)
-- period from these rows, one indexed read whatever the history. Day numbers are days since the Unix epoch (UTC).
CREATE TABLE usage_by_day (
    author_id     TEXT NOT NULL,
    day           BIGINT NOT NULL,
    program_id    TEXT NOT NULL,
    function_size TEXT NOT NULL,
    provider_id   TEXT NOT NULL,
    jobs          BIGINT NOT NULL,
    wait_ms       BIGINT NOT NULL,
    run_ms        BIGINT NOT NULL,
    cpu_core_ms   BIGINT NOT NULL,
    gib_ms        BIGINT NOT NULL,
    gpu_ms        BIGINT NOT NULL,
    PRIMARY KEY (author_id, day, program_id, function_size)
);
CREATE INDEX usage_by_day_provider_idx ON usage_by_day (provider_id, day);
CREATE INDEX usage_by_day_program_idx ON usage_by_day (program_id, day);
CREATE INDEX usage_by_day_day_idx ON usage_by_day (day);
