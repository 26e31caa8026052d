-- A provider's or a function's job count from an index alone (issue 32): a provider's count sums
-- its functions' kept counts, one range of this index per function, but each row of those
-- ranges then had to be read from its heap page, and a function's rows (one per user and
-- status) lie one to a page: 8,700 rows on 8,661 pages for the heaviest provider of the 10 M
-- scale seed, 12 ms. With `n` in the index (a key column, which both dialects index; not
-- `INCLUDE`, which SQLite lacks) PostgreSQL answers by an index-only scan: 1.1 ms.
-- The price: a counter update changes an indexed column, so it is no longer a HOT update (each
-- adds an entry to this index and the primary key); docs/benchmarks.md measures `run` beside it.
--
-- On PostgreSQL the gateway builds this index with CREATE INDEX CONCURRENTLY before running
-- this migration (`db::indexes`), so writes go on while a big table is indexed; the statement
-- below then finds it built. SQLite builds it here. The index it replaces goes (a short lock).
CREATE INDEX IF NOT EXISTS job_counts_program_n_idx ON job_counts (program_id, status, n);
DROP INDEX IF EXISTS job_counts_program_idx;
