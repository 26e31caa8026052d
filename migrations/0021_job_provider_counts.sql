-- A provider's job count from a few rows (issue 32): `jobs/provider/` counted a provider's jobs
-- by summing its functions' kept counts, one row per function, user and status: 8,700 index
-- entries for the heaviest provider of the 10 M scale seed, a cost that grows with the
-- provider's functions and their users. Now the jobs of provider functions are also counted per
-- provider and status, in the same transaction as every run, status move and retention batch.
-- As the slots in use (0016), each (provider, status) has a few rows (`shard`, taken in turn per
-- move), so concurrent runs of a popular provider's functions rarely wait for one row; a count
-- is the sum of its rows (a single row may go negative).
CREATE TABLE job_provider_counts (
    provider_id TEXT NOT NULL,
    status      TEXT NOT NULL,
    shard       BIGINT NOT NULL,
    n           BIGINT NOT NULL,
    PRIMARY KEY (provider_id, status, shard)
);

INSERT INTO job_provider_counts (provider_id, status, shard, n)
SELECT provider_id, status, 0, COUNT(*) FROM jobs WHERE provider_id IS NOT NULL GROUP BY provider_id, status;
