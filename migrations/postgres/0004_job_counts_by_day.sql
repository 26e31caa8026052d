-- Job counts also by creation day (days since the Unix epoch, UTC), so a listing with
-- `created_after` sums whole days from the counts and counts rows only within its first day.
CREATE TABLE job_counts_by_day (
    author_id   TEXT NOT NULL,
    program_id  TEXT NOT NULL,
    status      TEXT NOT NULL,
    day         BIGINT NOT NULL,
    n           BIGINT NOT NULL,
    PRIMARY KEY (author_id, program_id, status, day)
);
CREATE INDEX job_counts_by_day_program_idx ON job_counts_by_day (program_id, status, day);

INSERT INTO job_counts_by_day (author_id, program_id, status, day, n)
SELECT author_id, COALESCE(program_id, ''), status, created / 86400000000, COUNT(*) FROM jobs GROUP BY 1, 2, 3, 4;

DROP TABLE job_counts;
ALTER TABLE job_counts_by_day RENAME TO job_counts;
