-- The functions a user wrote, provider functions included (issue 32): `programs/` picks the
-- caller's functions by their relations instead of reading every provider function, and the
-- provider functions a user wrote were reachable only by a scan (the author index of 0001 holds
-- user functions alone).
CREATE INDEX programs_author_idx ON programs (author_id);
