-- A grant's idempotency key is an opaque value (a payment provider's event id is case-sensitive):
-- under the table's default collation (utf8mb4_general_ci on MariaDB, utf8mb4_0900_ai_ci on
-- MySQL 8) "evt_1AbC", "evt_1abc" and "evt_1AbC " were one key, so a second payment was
-- answered with the first one's grant and never credited. VARBINARY compares bytes, with no
-- case folding and no trailing-space padding. Re-running the statement is harmless.
ALTER TABLE grants MODIFY idempotency_key VARBINARY(128) NOT NULL;
