-- ended_calls counts every ended call of a named run that its row recorded (RecordRunCall),
-- those that used nothing (an upstream error, a refused call) included, which the calls column
-- does not count. Without it a run whose only calls used nothing had a row that recorded none
-- of them: once a Redis restart had lost its zero tally, the run was charged its hold. A rerun
-- after a crash between the DDL and the version row is harmless: Migrate tolerates
-- "duplicate column".
ALTER TABLE run_holds ADD COLUMN ended_calls INT NOT NULL DEFAULT 0;
