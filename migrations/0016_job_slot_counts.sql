-- The slots in use, kept (issue 32): pending and running jobs of every user, per kind (GPU or
-- not), changed in the same transaction as every status move into or out of PENDING/RUNNING.
-- `jobs/queue/` read them with a COUNT of every pending and running job (1.5 million rows of
-- the 10 million-job seed: past 30 s). Each move adds its +1 or -1 to one of a few rows per
-- kind (`shard`, picked at random per move), so concurrent moves rarely wait for one row; the
-- count is the sum of a kind's rows (a single row may go negative).
CREATE TABLE job_slot_counts (
    gpu     BOOLEAN NOT NULL,
    shard   BIGINT NOT NULL,
    n       BIGINT NOT NULL,
    PRIMARY KEY (gpu, shard)
);

INSERT INTO job_slot_counts (gpu, shard, n)
SELECT gpu, 0, COUNT(*) FROM jobs WHERE status IN ('PENDING', 'RUNNING') GROUP BY gpu;
