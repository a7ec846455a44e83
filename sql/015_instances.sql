-- A killed gateway's one-call holds no longer wait out hold_ttl (15 min) before the
-- reconciler settles them: every serving process keeps a row here, beaten every heartbeat on
-- the database clock, and stamps the holds it admits with its row's id. A row whose beat is
-- older than its holds.dead_instance_after is declared dead (dead_at) by the reconciler, which
-- then brings in the expiry of its one-call holds that have no lease in Redis, and they are
-- reconciled as DESIGN §5 says, minutes early. Only holds admitted before the row's last beat
-- plus the longest gap its beats allow are brought in: a hold admitted later shows its process
-- was alive after its beat stopped (its beats failing, not the process dead), and waits for its
-- expiry. A process that finds its row declared dead registers a new one; one shut down
-- gracefully marks its own row dead (retired), so a hold its drain left is swept at the next
-- pass once its lease has lapsed.
-- served_by is NULL on holds admitted before this column, by a gateway of the version before
-- it, or by tools: those wait for their expiry, as before. Instant column, no index (the sweep
-- reads the live holds, few, on the (state, expires_at) index): every admission and settlement
-- goes on. A rerun after a crash between the statements and the version row is harmless:
-- Migrate tolerates "duplicate column".
CREATE TABLE IF NOT EXISTS instances (
  id            CHAR(32)     NOT NULL, -- random per process start
  name          VARCHAR(255) NOT NULL, -- the configured instance name (host:pid by default)
  started_at    DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  beat_at       DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  max_gap_us    BIGINT       NOT NULL, -- the longest silence between two of its beats that is no gap
  dead_after_us BIGINT       NOT NULL, -- its own holds.dead_instance_after: never declared dead sooner
  dead_at       DATETIME(6)  NULL,     -- declared dead by a reconciler (its beat had stopped), or retired
  retired       TINYINT(1)   NOT NULL DEFAULT 0, -- dead_at set by its own graceful shutdown
  swept_at      DATETIME(6)  NULL,     -- every hold it admitted while alive brought in or settled
  PRIMARY KEY (id),
  KEY idx_instances_dead (dead_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
ALTER TABLE run_holds ADD COLUMN served_by CHAR(32) NULL;
