-- `Idempotency-Key` of `programs/run/` and `programs/upload/` (see `api::idempotency`): one row
-- per (user, key), reserved before the request runs and holding its answer once it has one, so a
-- retry gets the first answer instead of doing the work again. Kept 24 hours.
CREATE TABLE idempotency_keys (
    user_id         TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    -- The header's value: 1 to 255 visible ASCII characters.
    idempotency_key TEXT NOT NULL,
    -- Hex SHA-256 of the request (method, path, fields, files' bytes): the same key with another
    -- request is refused.
    request_hash    TEXT NOT NULL,
    -- Random id of the request holding the reservation: only it records the answer, so a
    -- request whose reservation was taken over cannot overwrite its successor's answer.
    owner           TEXT NOT NULL,
    -- NULL while the request is in progress; then the answer's status code and JSON body.
    status_code     INTEGER,
    body            TEXT,
    -- When the reservation was made (microseconds since the Unix epoch): a reservation without
    -- an answer is taken over after 60 s, and any row is expired after 24 h.
    created         BIGINT NOT NULL,
    CONSTRAINT idempotency_keys_pkey PRIMARY KEY (user_id, idempotency_key)
);
-- The expiry pass deletes the oldest rows in batches.
CREATE INDEX idempotency_keys_created_idx ON idempotency_keys (created);
