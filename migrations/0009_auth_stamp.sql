-- A counter raised by every change to what servers keep in memory about users (`gantry admin
-- deactivate-user`, `activate-user`): each server reads it (SQLite) or is told of it
-- (PostgreSQL NOTIFY on channel gantry_auth, sent in the same transaction) and forgets its
-- cached users, so the change takes effect on every replica at once.
CREATE TABLE auth_stamp (
    id INTEGER PRIMARY KEY,
    n BIGINT NOT NULL
);
INSERT INTO auth_stamp (id, n) VALUES (1, 0);
