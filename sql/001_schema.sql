-- tollgate schema, version 1. DATETIME(6) and NOW(6) everywhere: the database clock is the only
-- clock for expiry. Money columns are BIGINT micro-USD and end in _micro.

CREATE TABLE IF NOT EXISTS users (
  id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  name            VARCHAR(128)    NOT NULL,
  plan            VARCHAR(32)     NOT NULL,
  allowance_micro BIGINT          NULL,     -- NULL: the plan's daily allowance
  prepaid_micro   BIGINT          NOT NULL DEFAULT 0, -- may go below zero: bounded overdraft is real debt
  discount_bp     INT             NULL,     -- NULL: the plan's discount
  max_in_flight   INT             NULL,     -- NULL: the plan's limit
  disabled_at     DATETIME(6)     NULL,
  created_at      DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (id),
  UNIQUE KEY uq_users_name (name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS api_keys (
  key_hash   BINARY(32)      NOT NULL,  -- SHA-256 of the key; the key itself is never stored
  user_id    BIGINT UNSIGNED NOT NULL,
  prefix     VARCHAR(16)     NOT NULL,  -- first characters, to recognise a key in lists
  created_at DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  revoked_at DATETIME(6)     NULL,
  PRIMARY KEY (key_hash),
  KEY idx_api_keys_user (user_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS run_holds (
  run_id               VARCHAR(64)     NOT NULL,
  user_id              BIGINT UNSIGNED NOT NULL,
  client_run_id        VARCHAR(64)     NULL,  -- the caller's X-Run-Id, when it named one
  state                ENUM('queued','running','settled') NOT NULL,
  held_micro           BIGINT          NOT NULL,
  cap_micro            BIGINT          NOT NULL,
  cost_micro           BIGINT          NOT NULL DEFAULT 0, -- provider cost at list price
  charged_micro        BIGINT          NOT NULL DEFAULT 0, -- what the user paid: discounted, clamped to cap
  allowance_part_micro BIGINT          NOT NULL DEFAULT 0, -- of charged: taken from the day's allowance
  prepaid_part_micro   BIGINT          NOT NULL DEFAULT 0, -- of charged: taken from prepaid credits
  in_tok               BIGINT          NOT NULL DEFAULT 0,
  cache_read_tok       BIGINT          NOT NULL DEFAULT 0,
  cache_write_tok      BIGINT          NOT NULL DEFAULT 0,
  out_tok              BIGINT          NOT NULL DEFAULT 0,
  calls                INT             NOT NULL DEFAULT 0,
  model                VARCHAR(128)    NOT NULL DEFAULT '',
  session_id           VARCHAR(64)     NULL,
  price_snapshot       JSON            NULL,
  discount_bp          INT             NOT NULL DEFAULT 0,
  estimated            TINYINT(1)      NOT NULL DEFAULT 0,
  settle_source        VARCHAR(32)     NULL,
  expires_at           DATETIME(6)     NOT NULL,
  created_at           DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  settled_at           DATETIME(6)     NULL,
  PRIMARY KEY (run_id),
  KEY idx_run_holds_state_expires (state, expires_at),
  KEY idx_run_holds_user_state_expires (user_id, state, expires_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS usage_days (
  user_id    BIGINT UNSIGNED NOT NULL,
  day        DATE            NOT NULL, -- UTC day of settlement
  used_micro BIGINT          NOT NULL DEFAULT 0,
  run_count  INT             NOT NULL DEFAULT 0,
  PRIMARY KEY (user_id, day)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS grants (
  id                  BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  user_id             BIGINT UNSIGNED NOT NULL,
  amount_micro        BIGINT          NOT NULL,
  balance_after_micro BIGINT          NOT NULL,
  idempotency_key     VARCHAR(128)    NOT NULL,
  reason              VARCHAR(255)    NOT NULL DEFAULT '',
  created_at          DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (id),
  UNIQUE KEY uq_grants_idempotency_key (idempotency_key),
  KEY idx_grants_user (user_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS sessions (
  user_id        BIGINT UNSIGNED NOT NULL,
  session_id     VARCHAR(64)     NOT NULL,
  current_run_id VARCHAR(64)     NOT NULL,
  message_hash   BINARY(32)      NOT NULL,
  updated_at     DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (user_id, session_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
