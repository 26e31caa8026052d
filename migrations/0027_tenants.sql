-- Fair shares between tenants (issue 48). A tenant is a provider (its functions' jobs), a group
-- (its members' jobs of user functions) or an instance under `runtime_platform` (the jobs run
-- for it), named `<kind>:<key>` (`provider:acme`, `group:research`, `instance:crn:…`), with per
-- kind of slot (CPU, GPU) a guarantee (slots it is served first), a borrowing cap (slots it may
-- use beyond its guarantee; NULL: no cap) and a weight (its share of what is lent). Its GPU
-- guarantee may name a GPU model (`gpu_model`): then only its jobs of that model count toward
-- it and are served first by it. Set with `gantry admin set-quota`; admission reads them each
-- pass, so a change applies at the next pass.
CREATE TABLE tenants (
    name            TEXT PRIMARY KEY,
    kind            TEXT NOT NULL CONSTRAINT tenants_kind_check CHECK (kind IN ('provider', 'group', 'instance')),
    key             TEXT NOT NULL,
    cpu_guaranteed  BIGINT NOT NULL,
    cpu_borrow_cap  BIGINT,
    gpu_guaranteed  BIGINT NOT NULL,
    gpu_borrow_cap  BIGINT,
    gpu_model       TEXT,
    weight          BIGINT NOT NULL,
    updated         BIGINT NOT NULL
);

-- The tenant a job counts against (NULL: none), decided when it is queued (the most specific
-- tenant that matches: its instance, then its function's provider, then the first of its
-- author's groups by name for a user function) and decided again for every active job when a
-- tenant is declared or removed; whether it runs as backfill (its function's mark, or its run's
-- `config.backfill`): only on lent or unguaranteed capacity, stopped when a tenant reclaims its
-- guarantee.
ALTER TABLE jobs ADD COLUMN tenant TEXT;
-- The GPU model a GPU job asks for (its size's profile; NULL: any, or a CPU job).
ALTER TABLE jobs ADD COLUMN gpu_model TEXT;
ALTER TABLE jobs ADD COLUMN backfill BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE programs ADD COLUMN backfill BOOLEAN NOT NULL DEFAULT FALSE;

-- Their indexes (each tenant's oldest queued jobs; the backfill jobs holding slots) are made
-- after the migrations, concurrently on PostgreSQL (`db::indexes::AFTER_MIGRATIONS`): a plain
-- build here would hold every write to `jobs` while it reads the whole table.

-- What the last admission pass saw of each tenant (`''`: jobs of no tenant), per kind of slot:
-- the jobs holding slots (`used`), those of them that are not backfill (`firm`, what counts
-- toward the guarantee) and the jobs waiting in its window. Written by the pass when it changed;
-- read by `jobs/queue/`, `gantry admin quotas` and the per-tenant gauges, so none of them counts
-- the running jobs again.
CREATE TABLE tenant_shares (
    tenant   TEXT NOT NULL,
    gpu      BOOLEAN NOT NULL,
    used     BIGINT NOT NULL,
    firm     BIGINT NOT NULL,
    waiting  BIGINT NOT NULL,
    updated  BIGINT NOT NULL,
    PRIMARY KEY (tenant, gpu)
);

-- The tenant that reclaimed a backfill job's slot: its stop request names it, and the job ends
-- STOPPED with a reason that says so (or, when its function allows retries after start, is
-- queued again).
ALTER TABLE jobs ADD COLUMN preempted_by TEXT;
