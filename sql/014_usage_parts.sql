-- A run's row and a pruned day's sums keep, beside the token totals, the parts a provider's
-- invoice lists on lines of their own: the one-hour cache writes of cache_write_tok
-- (Anthropic's cache_control ttl "1h"), and the audio tokens of in_tok and out_tok (OpenAI's
-- input_audio parts, a spoken answer). They were priced apart but stored only in the totals,
-- so a billing team could not set the gateway's tokens against such an invoice line by line.
-- Each is a part of its total, never added to it. Rows written before these columns, or by a
-- gateway of the version before them (its statements name their columns), read 0. Instant
-- columns: every admission and settlement goes on. A rerun after a crash between the DDL and
-- the version row is harmless: Migrate tolerates "duplicate column".
ALTER TABLE run_holds ADD COLUMN cache_write_1h_tok BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN audio_in_tok BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN audio_out_tok BIGINT NOT NULL DEFAULT 0;
ALTER TABLE pruned_runs ADD COLUMN cache_write_1h_tok BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN audio_in_tok BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN audio_out_tok BIGINT NOT NULL DEFAULT 0;
