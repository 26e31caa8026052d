//! The statements that add to the kept counts, and the shard of the sharded ones a move takes.

/// Adds `$5` to the counts of (author `$1`, program `$2`, status `$3`), in total and for the
/// creation day `$4`.
pub(in crate::db) const COUNT_ADD: [&str; 2] = [
    "INSERT INTO job_counts (author_id, program_id, status, n) VALUES ($1, $2, $3, $5) \
     ON CONFLICT (author_id, program_id, status) DO UPDATE SET n = job_counts.n + excluded.n",
    "INSERT INTO job_counts_by_day (author_id, program_id, status, day, n) VALUES ($1, $2, $3, $4, $5) \
     ON CONFLICT (author_id, program_id, status, day) DO UPDATE SET n = job_counts_by_day.n + excluded.n",
];

/// Adds `$4` to the jobs of provider `$1` in status `$2`, in its row `$3` (migration 0021).
pub(in crate::db) const PROVIDER_ADD: &str = "INSERT INTO job_provider_counts (provider_id, status, shard, n) VALUES ($1, $2, $3, $4) \
     ON CONFLICT (provider_id, status, shard) DO UPDATE SET n = job_provider_counts.n + excluded.n";

/// Adds `$3` to the slots in use of the kind `$1` (GPU or not) in its row `$2` (migration 0016).
pub(in crate::db) const SLOT_ADD: &str = "INSERT INTO job_slot_counts (gpu, shard, n) VALUES ($1, $2, $3) \
     ON CONFLICT (gpu, shard) DO UPDATE SET n = job_slot_counts.n + excluded.n";

/// Rows per kind of the slots in use: moves take them in turn, so concurrent moves of one
/// process never wait for each other's row.
const SLOT_SHARDS: u64 = 16;

/// The slots-in-use (or queue block) row the next move of this process changes.
pub(in crate::db) fn slot_shard() -> i64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let next = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % SLOT_SHARDS;
    i64::try_from(next).unwrap_or(0)
}
