package proxy_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestAdmissionOnAFullDiskIs503AndChargesOnce: MariaDB on a full disk refuses a write that
// must grow a table at once, 1114 "The table … is full" (measured on MariaDB 10.11; README
// Operating it, Full disks). The test's run_holds lives on a small file system of its own
// (DATA DIRECTORY on a tmpfs the test mounts: it needs root, as the suite's machines and CI
// run), filled up while calls go on: each call is answered 200 or refused 503
// billing_unavailable, a refused one with nothing forwarded and nothing held; a named run
// admitted before goes on; and once there is room again an Idempotency-Key call refused so
// runs on retry, and every call answered is charged its price once (a settlement the full disk
// refused is tried again until there is room, within settle_timeout, or, when the writer's room
// slots are taken, left to the reconciler, which settles it from its tally).
func TestAdmissionOnAFullDiskIs503AndChargesOnce(t *testing.T) {
	dir := testenv.SmallFileSystem(t, "1m")
	db := testenv.MySQL(t)
	// Until room is given back: InnoDB's purge of the calls' changes on the full disk stops the
	// shared server (testenv.HoldPurge).
	purge := testenv.HoldPurge(t, db)
	testenv.TableOn(t, db, "run_holds", dir)
	// Slots enough: a call's settlement commits after its answer (later still while the full
	// disk refuses it and it retries), its slot held until then, and on a loaded machine the
	// plan's 3 (one the named run's) refused a call 429 too_many_in_flight before the disk
	// refused one.
	h := newHarnessOn(t, harnessSetup{db: db}, func(c *config.Config) { c.Plans["standard"] = bigPlan(c.Plans["standard"]) })
	u, key := h.user("standard")
	control := sendOK(t, "control call", h.gw.URL, key, chatBody, nil)
	want := h.run(u.ID, control.header.Get(proxy.RunIDHeader)).ChargedMicro
	sendOK(t, "named run's first call", h.gw.URL, key, chatBody, map[string]string{"X-Run-Id": "agent"})

	filler := filepath.Join(dir, "filler")
	// Room is given back before the purge does, whatever the test did.
	t.Cleanup(func() { _ = os.Remove(filler) })
	testenv.Fill(t, filler)
	answered := 1
	var refusedIdem string
	for i := 0; refusedIdem == ""; i++ {
		if i == 500 {
			t.Fatalf("no admission refused after %d calls on a full disk", i)
		}
		key2 := fmt.Sprintf("full-%d", i)
		all, _ := h.holdCount()
		calls := h.fake.Calls()
		a := send(h.gw.URL, key, chatBody, map[string]string{"Idempotency-Key": key2})
		switch {
		case a.status == 200:
			answered++
		case a.status == 503 && errorCode(t, a.body) == "billing_unavailable":
			if after, _ := h.holdCount(); after != all || h.fake.Calls() != calls {
				t.Fatalf("refused 503 on a full disk, but %d holds were taken and %d calls forwarded", after-all, h.fake.Calls()-calls)
			}
			refusedIdem = key2
		default:
			t.Fatalf("call %d on a full disk: %d %s, want 200 or 503 billing_unavailable", i, a.status, a.body)
		}
	}
	t.Logf("%d calls answered on the full disk before an admission was refused", answered-1)
	if a := send(h.gw.URL, key, chatBody, map[string]string{"X-Run-Id": "agent"}); a.status != 200 {
		t.Errorf("named run's call on a full disk: %d %s", a.status, a.body)
	}

	// Room again.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	purge()
	sendOK(t, "the Idempotency-Key call refused on a full disk, retried", h.gw.URL, key, chatBody, map[string]string{"Idempotency-Key": refusedIdem})
	answered++
	if status, out := h.settleRun(key, "agent"); status != 200 {
		t.Fatalf("named run's settle: %d %s", status, out)
	}
	h.settled()
	// A settlement the full disk refused while the writer's room slots were taken waits for its
	// hold's expiry and the reconciler.
	if _, err := h.db.Exec("UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE user_id = ? AND state <> 'settled'", u.ID); err != nil {
		t.Fatal(err)
	}
	rec := holds.NewReconciler(holds.ReconcilerConfig{Store: h.store, Usage: tallyUsage{h.tally},
		Leases: noLeases{}, Lock: alwaysLocked{}, Log: zap.NewNop(), ExtendBy: time.Minute})
	if _, err := rec.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	var plain []struct {
		State   string `db:"state"`
		Charged int64  `db:"charged_micro"`
	}
	if err := h.db.Select(&plain, "SELECT state, charged_micro FROM run_holds WHERE user_id = ? AND client_run_id IS NULL", u.ID); err != nil {
		t.Fatal(err)
	}
	if len(plain) != answered {
		t.Errorf("%d holds of calls, want one for each of the %d answered", len(plain), answered)
	}
	for _, r := range plain {
		if r.State != string(holds.StateSettled) || r.Charged != want {
			t.Errorf("a call answered 200: %s charged %d, want settled at %d", r.State, r.Charged, want)
		}
	}
}
