-- A gateway's database after about two months of traffic, for reading query plans at volume
-- (holds/plans_volume_test.go, README § Tests). MariaDB only: it counts with the SEQUENCE
-- engine's seq_1_to_N tables. Run it on a migrated, empty database:
--
--   mysql tollgate < scripts/seed-volume.sql
--
-- It writes, relative to NOW(): 10 000 users (20 heavy ones, user-00001, -00006, … -00096,
-- share a fifth of the runs), a key each (user N's is tg_volume_N; 2 000 more, revoked),
-- 1 500 000 settled runs over the last 60 days (named runs, sessions, five models, stamped by
-- 200 instances), 2 000 live holds and a backlog of 500 expired ones, the day ledger of every
-- user and day, 30 000 grants, 200 000 sessions, 300 000 pruned_runs rows of the four months
-- before, and 200 instance rows: about 2.5 minutes on a busy 2-core machine with a 1 GB buffer
-- pool. The money does not balance (the ledger is not the runs' sum): it is for plans, not
-- audits.
SET SESSION unique_checks = 0;
SET SESSION foreign_key_checks = 0;
SET @now = NOW(6);

INSERT INTO users (id, name, plan, prepaid_micro, created_at)
SELECT seq, CONCAT('user-', LPAD(seq, 5, '0')), IF(seq % 10 = 0, 'pro', 'standard'), seq * 1000,
       @now - INTERVAL 90 DAY + INTERVAL seq SECOND
FROM seq_1_to_10000;

INSERT INTO api_keys (key_hash, user_id, prefix, created_at, revoked_at)
SELECT UNHEX(SHA2(CONCAT('tg_volume_', seq), 256)), 1 + (seq - 1) % 10000, CONCAT('tg_volume_', seq),
       @now - INTERVAL 90 DAY, IF(seq > 10000, @now - INTERVAL 30 DAY, NULL)
FROM seq_1_to_12000;

INSERT INTO instances (id, name, started_at, beat_at, max_gap_us, dead_after_us, dead_at, retired, swept_at)
SELECT MD5(CONCAT('instance-', seq)), CONCAT('gw-', seq), @now - INTERVAL (200 - seq) * 7 HOUR,
       IF(seq > 196, @now, @now - INTERVAL (199 - seq) * 7 HOUR), 15000000, 60000000,
       IF(seq > 196, NULL, @now - INTERVAL (199 - seq) * 7 HOUR), seq % 2,
       IF(seq > 196, NULL, @now - INTERVAL (199 - seq) * 7 HOUR + INTERVAL 1 MINUTE)
FROM seq_1_to_200;

-- Settled runs: seq spreads them evenly over 60 days; a fifth belong to the 100 heavy users.
INSERT INTO run_holds (run_id, user_id, client_run_id, state, held_micro, cap_micro, cost_micro, charged_micro,
                       allowance_part_micro, prepaid_part_micro, in_tok, out_tok, calls, ended_calls, model, session_id,
                       discount_bp, estimated, settle_source, expires_at, created_at, settled_at, admit_token, settle_token, served_by)
SELECT r.run_id, r.user_id, IF(r.seq % 7 = 0, CONCAT('agent-', r.seq), NULL), 'settled', 20000, 500000, r.cost, r.cost,
       r.cost, 0, 1000 + r.seq % 5000, 100 + r.seq % 900, 1 + (r.seq % 7 = 0) * 4, 1 + (r.seq % 7 = 0) * 4,
       ELT(1 + r.seq % 5, 'gpt-4o', 'gpt-4o-mini', 'claude-sonnet-4', 'o3', 'gpt-4.1'),
       IF(r.seq % 3 = 0, CONCAT('chat-', r.seq % 200000), NULL), 0, r.seq % 50 = 0, 'call',
       r.created + INTERVAL 15 MINUTE, r.created, r.created + INTERVAL 2 SECOND, MD5(r.seq), MD5(-r.seq),
       MD5(CONCAT('instance-', 1 + FLOOR((60 * 86400 - r.age) / (7 * 3600)) % 200))
FROM (SELECT seq, MD5(CONCAT('run-', seq)) AS run_id,
             IF(seq % 5 = 0, 1 + seq % 100, 101 + seq % 9900) AS user_id,
             (seq * 7919) % 40000 AS cost,
             60 * 86400 - seq * 3.456 AS age,
             @now - INTERVAL (60 * 86400 - seq * 3.456) SECOND - INTERVAL 1 HOUR AS created
      FROM seq_1_to_1500000) r;

-- Live holds (in flight now) and the reconciler's backlog (expired, not yet settled).
INSERT INTO run_holds (run_id, user_id, client_run_id, state, held_micro, cap_micro, model, expires_at, created_at, admit_token, served_by)
SELECT MD5(CONCAT('live-', seq)), 1 + seq % 10000, IF(seq % 4 = 0, CONCAT('live-agent-', seq), NULL),
       IF(seq % 3 = 0, 'queued', 'running'), 20000, 500000, 'gpt-4o',
       IF(seq > 2000, @now - INTERVAL seq SECOND, @now + INTERVAL 15 MINUTE - INTERVAL seq % 600 SECOND),
       IF(seq > 2000, @now - INTERVAL 20 MINUTE - INTERVAL seq SECOND, @now - INTERVAL seq % 600 SECOND),
       MD5(CONCAT('live-', seq)), MD5(CONCAT('instance-', 197 + seq % 4))
FROM seq_1_to_2500;

INSERT INTO usage_days (user_id, day, used_micro, run_count)
SELECT u.seq, DATE(@now) - INTERVAL d.seq DAY, 1000 * d.seq, d.seq
FROM seq_1_to_10000 u CROSS JOIN seq_0_to_59 d;

INSERT INTO grants (user_id, amount_micro, balance_after_micro, idempotency_key, reason, attempt_token, created_at)
SELECT 1 + seq % 10000, 1000000, seq * 1000, CONCAT('evt_', seq), 'top-up', MD5(seq), @now - INTERVAL 90 DAY + INTERVAL seq * 200 SECOND
FROM seq_1_to_30000;

INSERT INTO sessions (user_id, session_id, current_run_id, message_hash, updated_at)
SELECT 101 + seq % 9900, CONCAT('chat-', seq), MD5(CONCAT('run-', seq * 3)), UNHEX(SHA2(seq, 256)),
       @now - INTERVAL (60 * 86400 - seq * 25.92) SECOND
FROM seq_1_to_200000;

-- What prunes of the four months before the kept runs left.
INSERT INTO pruned_runs (user_id, day, model, runs, charged_runs, calls, in_tok, out_tok, cost_micro, charged_micro, allowance_part_micro)
SELECT 1 + u.seq * 33 % 10000, DATE(@now) - INTERVAL 61 + d.seq DAY, ELT(1 + (u.seq + d.seq) % 5, 'gpt-4o', 'gpt-4o-mini', 'claude-sonnet-4', 'o3', 'gpt-4.1'),
       5, 5, 5, 5000, 500, 100000, 100000, 100000
FROM seq_1_to_2500 u CROSS JOIN seq_0_to_119 d;

ANALYZE TABLE users, api_keys, run_holds, usage_days, grants, sessions, pruned_runs, instances;
