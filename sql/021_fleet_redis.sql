-- Two operator commands took what they need of the fleet's Redis from their own config, as
-- the others took credit_micro (017) and plan terms (018):
-- * `gateway reconcile -once` read tallies and leases under its own redis_key_prefix
--   (TOLLGATE_REDIS_PREFIX): run with another than the gateways', it found none, and charged
--   live calls and tallied ones their whole holds. `gateway serve` records here the prefix it
--   serves under (one row, id 1); `reconcile -once` refuses another, or any while none is
--   recorded, and serve refuses another unless it is started with -change-redis-prefix.
-- * `gateway prune` bounded its cutoff by its own config's holds.tally_ttl and
--   dedup.replay_ttl, while a gateway serving with longer ones keeps a run's tally, or an
--   Idempotency-Key's record of it, in Redis longer than that. Each `gateway serve` records
--   here the longer of its value and the one recorded (one row each, id 1): the longest any
--   gateway has served with, which prune's cutoff must pass.
-- New tables: nothing else is touched, and gateways of before it never read them.
CREATE TABLE IF NOT EXISTS redis_prefix (
  id      TINYINT      NOT NULL, -- always 1: the fleet shares one Redis namespace
  prefix  BLOB         NOT NULL, -- byte for byte, as the keys are named
  set_by  VARCHAR(255) NOT NULL, -- the instance name of the gateway that recorded it
  set_at  DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
CREATE TABLE IF NOT EXISTS longest_tally_ttl (
  id           TINYINT      NOT NULL, -- always 1
  tally_ttl_ms BIGINT       NOT NULL,
  set_by       VARCHAR(255) NOT NULL, -- the instance name of the gateway that served with it
  set_at       DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
CREATE TABLE IF NOT EXISTS longest_replay_ttl (
  id            TINYINT      NOT NULL, -- always 1
  replay_ttl_ms BIGINT       NOT NULL,
  set_by        VARCHAR(255) NOT NULL, -- the instance name of the gateway that served with it
  set_at        DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
