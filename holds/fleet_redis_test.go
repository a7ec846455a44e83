package holds_test

import (
	"sync"
	"testing"
	"time"
)

// TestGatewaysStartingAtOnceRecordTheLongestTTLs: gateways starting at once with different
// Redis TTLs, on a database with none recorded or with shorter ones: the longest of each is
// recorded, by the gateway that served with it, whichever start commits first, and a later
// start with shorter ones lowers nothing and says it raised nothing.
func TestGatewaysStartingAtOnceRecordTheLongestTTLs(t *testing.T) {
	e := newStoreEnv(t)
	for round := 0; round < 10; round++ {
		for _, q := range []string{"DELETE FROM longest_tally_ttl", "DELETE FROM longest_replay_ttl"} {
			if _, err := e.db.Exec(q); err != nil {
				t.Fatal(err)
			}
		}
		starts := []struct {
			by            string
			tally, replay time.Duration
		}{{"gw-a", 48 * time.Hour, 240 * time.Hour}, {"gw-b", 96 * time.Hour, 24 * time.Hour}, {"gw-c", 72 * time.Hour, 48 * time.Hour}}
		errs := make([]error, len(starts))
		var wg sync.WaitGroup
		for i, s := range starts {
			wg.Go(func() { _, _, errs[i] = e.store.RecordTTLs(e.ctx(), s.tally, s.replay, s.by) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: %s: %v", round, starts[i].by, err)
			}
		}
		tally, replay, err := e.store.LongestTTLs(e.ctx())
		if err != nil {
			t.Fatal(err)
		}
		if tally.TTL != 96*time.Hour || tally.SetBy != "gw-b" || replay.TTL != 240*time.Hour || replay.SetBy != "gw-a" {
			t.Fatalf("round %d: recorded tally %v by %s, replay %v by %s; want 96h by gw-b, 240h by gw-a",
				round, tally.TTL, tally.SetBy, replay.TTL, replay.SetBy)
		}
	}
	raisedTally, raisedReplay, err := e.store.RecordTTLs(e.ctx(), 48*time.Hour, 24*time.Hour, "gw-short")
	if err != nil || raisedTally || raisedReplay {
		t.Fatalf("a start with shorter TTLs: raised %v, %v, %v; want nothing raised", raisedTally, raisedReplay, err)
	}
	if tally, replay, err := e.store.LongestTTLs(e.ctx()); err != nil || tally.TTL != 96*time.Hour || replay.TTL != 240*time.Hour {
		t.Fatalf("after a start with shorter TTLs: %v, %v, %v; want 96h and 240h kept", tally.TTL, replay.TTL, err)
	}
	if raisedTally, raisedReplay, err := e.store.RecordTTLs(e.ctx(), 120*time.Hour, 24*time.Hour, "gw-long"); err != nil || !raisedTally || raisedReplay {
		t.Fatalf("a start with a longer tally_ttl: raised %v, %v, %v; want the tally_ttl alone", raisedTally, raisedReplay, err)
	}
}
