-- The reconciler revisits the runs it charged their hold (settle_source 'reconcile_hold') within
-- the last holds.tally_ttl, to give back by grant what a call that came back after the charge
-- says it did not use (holds.Reconciler, refundPaused). Those runs are a handful among every run
-- settled in that window: by (settle_source, settled_at) a pass reads them alone, where the
-- index on settled_at read every settlement of the window row by row at every pass. Built online:
-- admissions and settlements go on. A rerun after a crash between the statement and the version
-- row is harmless: Migrate tolerates "duplicate key name".
ALTER TABLE run_holds ADD INDEX idx_run_holds_source_settled (settle_source, settled_at);
