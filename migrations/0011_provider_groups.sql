-- Groups from an identity provider are exact on every request: for a user whose groups the
-- provider sets (`users.groups_from_provider`, raised by the first request that carried them),
-- only the memberships written from the provider's answer (`group_members.from_provider`) grant
-- access; one added by hand (`gantry admin add-member`) grants nothing, even before the next
-- request replaces it. Provider admin groups are `gantry admin`'s and always count.
ALTER TABLE users ADD COLUMN groups_from_provider BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE group_members ADD COLUMN from_provider BOOLEAN NOT NULL DEFAULT FALSE;
