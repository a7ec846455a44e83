-- X-Session-Id is an opaque value of the caller's: under the table's default collation
-- ("Chat-A" = "chat-a" = "chat-a ") two sessions of one user were one row, and a message in
-- one cancelled the other's running call as superseded. VARBINARY compares bytes. Re-running
-- the statement is harmless.
ALTER TABLE sessions MODIFY session_id VARBINARY(64) NOT NULL;
