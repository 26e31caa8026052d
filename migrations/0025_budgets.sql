-- Budgets (issue 47): an operator's limit on what a user, a group (its members' jobs together)
-- or one provider's function (every user's jobs of it) may use per calendar month (UTC), in
-- core-milliseconds of allocated CPU and GPU-milliseconds (NULL: no limit of that kind). A run
-- that would start past a spent budget is refused; a running job is never stopped by one.
CREATE TABLE budgets (
    kind        TEXT NOT NULL CONSTRAINT budgets_kind_check CHECK (kind IN ('user', 'group', 'function')),
    subject_id  TEXT NOT NULL,
    cpu_core_ms BIGINT,
    gpu_ms      BIGINT,
    PRIMARY KEY (kind, subject_id)
);
