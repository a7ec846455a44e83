-- claim_replaced is what the session claim of a run (X-Session-Id) replaced, written in the
-- claim's own transaction: '' for nothing (a new session, or one whose run had ended), else
-- the live run it took the session from; NULL while no claim of the run has committed. When
-- the reply to a claim's COMMIT is lost, the retry may find the session on a newer message's
-- run: only this tells it that its first attempt committed (it is then the older message and
-- must not take the session back) and which run that attempt replaced (which must still be
-- cancelled). An instant column: every admission and settlement goes on, and a gateway of
-- before it never names it. A rerun after a crash between the DDL and the version row is
-- harmless: Migrate tolerates "duplicate column".
ALTER TABLE run_holds ADD COLUMN claim_replaced VARCHAR(64) NULL;
