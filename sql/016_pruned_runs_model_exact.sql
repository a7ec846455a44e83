-- The usage report groups by the model each call named, which the gateway prices and forwards
-- byte for byte ("gpt-4o-MINI" is priced by the prefix "gpt-4o", "gpt-4o-mini" by its own
-- name). Under the table's default collation the pruned sums of "gpt-4o-X" and "gpt-4o-x", or of
-- "gpt-4o" and "gpt-4o ", were one row of the primary key, and a prune merged them into it:
-- a pruned day's report showed one model's row with tokens and cost no single price explains.
-- VARBINARY compares bytes, with no case folding and no trailing-space padding; 512 bytes hold
-- any VARCHAR(128) in utf8mb4. Sums already merged stay merged. Only `gateway prune` writes
-- the table, and waits for the rebuild. Re-running the statement is harmless.
ALTER TABLE pruned_runs MODIFY model VARBINARY(512) NOT NULL;
