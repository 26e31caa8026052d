-- Places in the queue without counting the queue (issue 32): `jobs/queue/` tells each of the
-- caller's queued jobs how many queued jobs of every user came before it. Counted over the
-- queued jobs' index, that read the queue up to each listed job: with the 2 million queued jobs
-- of the 10 M scale seed, 25 s per request. Now the queued jobs are also counted per hour of
-- their creation (`block` = created / 3,600,000,000 microseconds), kept in the same transaction
-- as every run and every move out of QUEUED, so a place is the sum of the hours before its
-- job's hour plus the queued jobs of its own hour before it (an index range of that hour).
-- As the slots in use (0016), each hour has a few rows (`shard`, taken in turn per move), so
-- concurrent runs and moves rarely wait for one row; a block's count is the sum of its rows.
CREATE TABLE job_queue_counts (
    block   BIGINT NOT NULL,
    shard   BIGINT NOT NULL,
    n       BIGINT NOT NULL,
    PRIMARY KEY (block, shard)
);

INSERT INTO job_queue_counts (block, shard, n)
SELECT created / 3600000000, 0, COUNT(*) FROM jobs WHERE status = 'QUEUED' GROUP BY created / 3600000000;

-- The id in the unfinished jobs' index by status: an hour's queued jobs before a given one
-- (creation time, then id) are then counted from the index alone. It replaces the index
-- without the id, which admission reads the same way.
--
-- On PostgreSQL the gateway builds this index with CREATE INDEX CONCURRENTLY before running
-- this migration (`db::indexes`); the statement below then finds it built. SQLite builds it
-- here. The index it replaces goes (a short lock).
CREATE INDEX IF NOT EXISTS jobs_active_status_created_id_idx ON jobs (status, created, id) WHERE status IN ('QUEUED','PENDING','RUNNING');
DROP INDEX IF EXISTS jobs_active_status_created_idx;
