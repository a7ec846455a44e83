-- `gateway prune` deletes settled runs older than a cutoff (a run_holds row per call would
-- otherwise be kept for good). What it deletes is first added here, per user, UTC settlement
-- day and model — the usage report's grouping — in the same transaction, so the usage report
-- over a pruned day, the day ledger's audit and each user's prepaid audit (grants less the
-- prepaid parts of charges) read the same totals after a prune as before it. Only prune
-- writes this table; nothing on a call's path reads it.
CREATE TABLE IF NOT EXISTS pruned_runs (
  user_id              BIGINT UNSIGNED NOT NULL,
  day                  DATE            NOT NULL, -- UTC day of settlement, as usage_days
  model                VARCHAR(128)    NOT NULL,
  runs                 BIGINT          NOT NULL DEFAULT 0,
  charged_runs         BIGINT          NOT NULL DEFAULT 0, -- of runs: those that charged anything
  calls                BIGINT          NOT NULL DEFAULT 0,
  in_tok               BIGINT          NOT NULL DEFAULT 0,
  cache_read_tok       BIGINT          NOT NULL DEFAULT 0,
  cache_write_tok      BIGINT          NOT NULL DEFAULT 0,
  out_tok              BIGINT          NOT NULL DEFAULT 0,
  cost_micro           BIGINT          NOT NULL DEFAULT 0,
  charged_micro        BIGINT          NOT NULL DEFAULT 0,
  allowance_part_micro BIGINT          NOT NULL DEFAULT 0,
  prepaid_part_micro   BIGINT          NOT NULL DEFAULT 0,
  PRIMARY KEY (user_id, day, model)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
