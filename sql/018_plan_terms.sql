-- The operator's commands take the plans from their own config, as they took credit_micro
-- (017): with a copy of the config that fell behind the fleet's, `reconcile -once` split a
-- charge between the day's allowance and prepaid credits by another allowance than the
-- gateways do, and `balance` showed another allowance, silently. `gateway serve` records here
-- the terms its plans hold and charge by (one row, id 1: a JSON document of each plan's
-- allowance, hold tiers, heavy_after_turns, max_run_cost and discount_bp in micro-USD, and
-- default_plan), overwriting, and logging, what another config recorded: plans change
-- routinely, and a serve is how. The commands that use plan terms refuse a config whose plans
-- differ, or any while none are recorded.
-- A new table: nothing else is touched, and gateways of before it never read it.
CREATE TABLE IF NOT EXISTS plan_terms (
  id       TINYINT      NOT NULL, -- always 1: the fleet serves one set of plans
  terms    MEDIUMTEXT   NOT NULL, -- JSON, holds.PlanTerms
  set_by   VARCHAR(255) NOT NULL, -- the instance name of the gateway that recorded them
  set_at   DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
