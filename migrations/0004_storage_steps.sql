-- One-time steps on stored objects (moving files to a newer layout), recorded when they
-- completed so a start-up does not repeat them.
CREATE TABLE storage_steps (
    name       TEXT PRIMARY KEY,
    -- Microseconds since the Unix epoch.
    completed  BIGINT NOT NULL
);
