-- run_calls is the calls of a live named run that its row records (RecordRunCall adds each
-- call's figures to run_holds), one row per call, written in the same transaction as the
-- figures it adds. A record whose reply is lost, whose statement a deadline cut, or that a
-- lock wait or the network ended, may or may not have landed; sent again with the same call
-- id it is counted once, since the key it writes is taken if the first landed. Without it a
-- record that failed so was never sent again (it could have counted the call twice), and a
-- Redis restart before the run settled took the call from the run's charge.
--
-- The rows live only as long as their run: the settlement that ends the run deletes them in
-- its own transaction (under the run's row lock, which a record takes first, so no record
-- adds one after), and `gateway prune` deletes any a settlement left (one by a gateway of
-- before this table, during a rolling upgrade). run_id is run_holds'; call_id the gateway's
-- own random id of the call.
CREATE TABLE IF NOT EXISTS run_calls (
  run_id  VARCHAR(64) NOT NULL,
  call_id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  PRIMARY KEY (run_id, call_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
