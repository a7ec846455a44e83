-- credit_micro (micro-USD per credit) is a setting, and the database stores micro-USD: an
-- operator's command run with another config than the fleet's (none: the default 1000, or a
-- stale one) converted credits at its own value, silently — `gateway grant -amount 5` to a
-- fleet serving at 10000 credited half of one of its credits, and balances, reports and the
-- allowance/prepaid split of `reconcile -once` were off by the same factor. `gateway serve`
-- records here the credit_micro it serves at (one row, id 1); the operator's commands that
-- convert credits refuse a config whose credit_micro differs, or any while none is recorded,
-- and serve refuses one that differs unless it is started with -change-credit-micro.
-- A new table: nothing else is touched, and gateways of before it never read it.
CREATE TABLE IF NOT EXISTS credit_unit (
  id           TINYINT      NOT NULL, -- always 1: the fleet has one credit
  credit_micro BIGINT       NOT NULL,
  set_by       VARCHAR(255) NOT NULL, -- the instance name of the gateway that recorded it
  set_at       DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
