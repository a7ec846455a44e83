-- A key's listing (GET /admin/users/{name}/keys, `gateway key list`) pages newest first, and a
-- page's cursor must name one key: the primary key is the key's SHA-256, which no listing
-- shows, and the prefix it does show is not unique. Each key gets a number of its own, shown
-- as its id; keys are ordered by (created_at, id), which is total, so no key is skipped or
-- listed twice across pages (ids given to the keys that exist follow their hashes, not their
-- age, hence created_at first). The second index makes one user's page a range read. Keys are
-- few and written rarely (created, revoked): the table rebuild this takes is short, and key
-- lookups read through it. A rerun after a crash between a statement and the version row is
-- harmless: Migrate tolerates "duplicate column name" and "duplicate key name".
ALTER TABLE api_keys ADD COLUMN id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT, ADD UNIQUE KEY uq_api_keys_id (id);
ALTER TABLE api_keys ADD INDEX idx_api_keys_user_created (user_id, created_at, id);
