-- Gantry schema. Ids are lower-case hyphenated UUID text; timestamps are microseconds since the
-- Unix epoch (UTC) in BIGINT, so both backends share one query text and one row type.
-- JSON values are stored as text and parsed by the gateway.

CREATE TABLE users (
    id          TEXT PRIMARY KEY,
    username    TEXT NOT NULL CONSTRAINT users_username_key UNIQUE,
    is_active   BOOLEAN NOT NULL DEFAULT TRUE,
    created     BIGINT NOT NULL
);

CREATE TABLE user_groups (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL CONSTRAINT user_groups_name_key UNIQUE,
    created     BIGINT NOT NULL
);

CREATE TABLE group_members (
    group_id    TEXT NOT NULL REFERENCES user_groups (id) ON DELETE CASCADE,
    user_id     TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    PRIMARY KEY (group_id, user_id)
);
-- "groups of this caller" is asked on every visibility check.
CREATE INDEX group_members_user_idx ON group_members (user_id);

CREATE TABLE providers (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL CONSTRAINT providers_name_key UNIQUE,
    -- Image prefix restriction: a custom image must equal it or start with it followed by '/'.
    registry    TEXT,
    created     BIGINT NOT NULL
);

CREATE TABLE provider_admin_groups (
    provider_id TEXT NOT NULL REFERENCES providers (id) ON DELETE CASCADE,
    group_id    TEXT NOT NULL REFERENCES user_groups (id) ON DELETE CASCADE,
    PRIMARY KEY (provider_id, group_id)
);

CREATE TABLE programs (
    id                TEXT PRIMARY KEY,
    title             TEXT NOT NULL,
    provider_id       TEXT REFERENCES providers (id),
    -- The first uploader; kept when another provider admin uploads a new version.
    author_id         TEXT NOT NULL REFERENCES users (id),
    entrypoint        TEXT,
    -- Object storage key of the current artifact tar.
    artifact_key      TEXT,
    image             TEXT,
    dependencies      TEXT NOT NULL DEFAULT '[]',
    env_vars          TEXT NOT NULL DEFAULT '{}',
    -- NULL: no schema. Otherwise JSON text of an object or a boolean.
    arguments_schema  TEXT,
    type              TEXT NOT NULL DEFAULT 'GENERIC',
    version           TEXT,
    description       TEXT,
    documentation_url TEXT,
    runner            TEXT NOT NULL DEFAULT 'local',
    gpu               BOOLEAN NOT NULL DEFAULT FALSE,
    disabled          BOOLEAN NOT NULL DEFAULT FALSE,
    disabled_message  TEXT,
    -- Size catalog: JSON object {label: compute profile or null}, labels uppercase.
    sizes             TEXT NOT NULL DEFAULT '{}',
    default_size      TEXT,
    created           BIGINT NOT NULL,
    updated           BIGINT NOT NULL
);
-- Titles are unique per provider for provider functions and per author for user functions.
CREATE UNIQUE INDEX programs_provider_title_key ON programs (provider_id, title) WHERE provider_id IS NOT NULL;
CREATE UNIQUE INDEX programs_author_title_key ON programs (author_id, title) WHERE provider_id IS NULL;

-- Grants of a group on one provider function (the reference's instance groups).
CREATE TABLE program_grants (
    program_id  TEXT NOT NULL REFERENCES programs (id) ON DELETE CASCADE,
    group_id    TEXT NOT NULL REFERENCES user_groups (id) ON DELETE CASCADE,
    can_view    BOOLEAN NOT NULL DEFAULT FALSE,
    can_run     BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (program_id, group_id)
);
CREATE INDEX program_grants_group_idx ON program_grants (group_id);

CREATE TABLE jobs (
    id            TEXT PRIMARY KEY,
    program_id    TEXT REFERENCES programs (id) ON DELETE SET NULL,
    -- Denormalized from the program so provider and catalog/serverless filters need no join.
    provider_id   TEXT REFERENCES providers (id),
    author_id     TEXT NOT NULL REFERENCES users (id),
    status        TEXT NOT NULL DEFAULT 'QUEUED'
                  CONSTRAINT jobs_status_check CHECK (status IN ('QUEUED','PENDING','RUNNING','SUCCEEDED','FAILED','STOPPED')),
    sub_status    TEXT,
    -- Legacy columns: arguments and results live in object storage; these keep inline copies.
    arguments     TEXT NOT NULL DEFAULT '{}',
    result        TEXT,
    -- Database fallback for logs when neither the archive nor the live source has them.
    logs          TEXT NOT NULL DEFAULT '',
    config        TEXT NOT NULL DEFAULT '{}',
    env_vars      TEXT NOT NULL DEFAULT '{}',
    runner        TEXT NOT NULL DEFAULT 'local',
    gpu           BOOLEAN NOT NULL DEFAULT FALSE,
    function_size TEXT,
    created       BIGINT NOT NULL,
    updated       BIGINT NOT NULL,
    -- When the job last showed activity (status, sub-status or error event): the timeout clock.
    last_activity BIGINT NOT NULL
);
-- GET jobs/: the caller's jobs newest first, optionally by status, function or provider.
CREATE INDEX jobs_author_created_idx ON jobs (author_id, created DESC, id DESC);
CREATE INDEX jobs_author_status_created_idx ON jobs (author_id, status, created DESC, id DESC);
CREATE INDEX jobs_author_program_created_idx ON jobs (author_id, program_id, created DESC, id DESC);
CREATE INDEX jobs_author_provider_created_idx ON jobs (author_id, provider_id, created DESC, id DESC);
-- GET jobs/provider/ and programs/{id}/get_jobs/: all authors' jobs of a provider or program.
CREATE INDEX jobs_provider_created_idx ON jobs (provider_id, created DESC, id DESC);
CREATE INDEX jobs_program_created_idx ON jobs (program_id, created DESC, id DESC);
-- Scheduler: active jobs by status, oldest first; the active-job limit counts per author.
CREATE INDEX jobs_active_status_created_idx ON jobs (status, created) WHERE status IN ('QUEUED','PENDING','RUNNING');
CREATE INDEX jobs_active_author_idx ON jobs (author_id) WHERE status IN ('QUEUED','PENDING','RUNNING');

CREATE TABLE job_events (
    id          TEXT PRIMARY KEY,
    job_id      TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    created     BIGINT NOT NULL,
    event_type  TEXT NOT NULL,
    origin      TEXT NOT NULL,
    context     TEXT NOT NULL,
    data        TEXT NOT NULL DEFAULT '{}'
);
-- GET jobs/{id}/events/ newest first, optionally by type.
CREATE INDEX job_events_job_created_idx ON job_events (job_id, created DESC);
CREATE INDEX job_events_job_type_created_idx ON job_events (job_id, event_type, created DESC);

-- IBM Runtime jobs a serverless job started (reported by the job itself).
CREATE TABLE runtime_jobs (
    runtime_job     TEXT PRIMARY KEY,
    job_id          TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    runtime_session TEXT,
    created         BIGINT NOT NULL
);
CREATE INDEX runtime_jobs_job_idx ON runtime_jobs (job_id);
