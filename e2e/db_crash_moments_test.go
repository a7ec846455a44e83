package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// TestMariaDBCrashAtEachCommit kills the database, one moment at a time, just after the COMMIT
// of a money path other than a call's own admission or settlement (TestMariaDBCrashUnderTraffic's)
// has gone out and while its reply is lost (the tripwire), and restarts it. Each moment is then
// checked against what README promises of that path, and the books (holds.Audit) at the end:
//
//  1. a batch of the group commit carrying admissions and the settlements of two users at once,
//     with an outage longer than limits.admit_timeout: each call answered whole is charged its
//     price once, each refused one (503 billing_unavailable) nothing;
//  2. POST /v1/runs/{id}/settle, with an outage longer than limits.settle_timeout: the settle is
//     answered 503, the agent's retry after the restart the settled run at what its calls cost
//     (once), and a later call of the run 409 run_settled;
//  3. `gateway reconcile -once -force`, killed after one settlement's COMMIT: the pass finishes
//     after the restart, each hold charged once (tally, release, hold), and a second pass
//     charges nothing;
//  4. `gateway grant`, killed after its COMMIT: the grant is applied once, and the same grant
//     again (the operator's retry) credits nothing;
//  5. `gateway prune`, killed after its first batch's COMMIT: the prune finishes after the
//     restart, and a rerun prunes nothing; the day's sums are what they were.
func TestMariaDBCrashAtEachCommit(t *testing.T) {
	m := startPrivateMariaDB(t)
	m.migrate()
	w := newWorldAt(t, m.dsn())
	k := &killer{t: t, m: m, db: w.db}
	// Every connection of the gateways, and of the commands, passes a relay that can lose the
	// reply to one write.
	trip := newTripwire(t, fmt.Sprintf("127.0.0.1:%d", m.port))
	viaTrip := "MYSQL_DSN=" + m.dsnAt(trip.addr())

	// 1. A group-commit batch of two users' settlements and admissions.
	w.config = w.writeConfig(map[string]string{"limits.admit_timeout": "1s", "holds.hold_ttl": "8s"})
	g := w.startGatewayWith("gw-batch", w.config, viaTrip)
	momentBatch(t, w, k, trip, g)
	stopGateway(t, g)

	// 2. A named run's settle on request.
	w.config = w.writeConfig(map[string]string{"limits.settle_timeout": "1s", "holds.run_ttl": "60s"})
	g = w.startGatewayWith("gw-settle", w.config, viaTrip)
	momentRunSettle(t, w, k, trip, g)
	stopGateway(t, g)

	// The commands run with no gateway beside them: their COMMIT is the only one on the relay.
	cli := m.dsnAt(trip.addr())
	momentReconcile(t, w, k, trip, cli)
	momentGrant(t, w, k, trip, cli)
	momentPrune(t, w, k, trip, cli)

	if bad, err := holds.Audit(context.Background(), w.db); err != nil || len(bad) > 0 {
		t.Errorf("audit after the crashes: %v %+v", err, bad)
	}
}

// killer kills the private MariaDB once a tripwire has fired and restarts it after an outage.
type killer struct {
	t  *testing.T
	m  *privateMariaDB
	db *sqlx.DB // straight to m, not through the tripwire
}

// at waits (bounded) for trip to fire and for the server's answer to the write that fired it
// (which the tripwire drops), kills the server, keeps it down for outage and restarts it.
func (k *killer) at(trip *tripwire, fired <-chan struct{}, what string, outage time.Duration) {
	k.t.Helper()
	select {
	case <-fired:
	case <-time.After(20 * time.Second):
		k.t.Fatalf("%s: no such write within 20s", what)
	}
	awaitAnswer(k.t, trip, k.db, what)
	k.m.kill()
	time.Sleep(outage)
	k.m.restart()
	k.t.Logf("MariaDB SIGKILLed once it had run %s (its reply lost), restarted after %v", what, outage)
}

func stopGateway(t *testing.T, g *gateway) {
	t.Helper()
	g.signal(t, syscall.SIGTERM)
	if err := g.wait(t, 20*time.Second); err != nil {
		t.Fatalf("gateway %s: %v", g.name, err)
	}
}

// momentCall is one call of momentBatch and how it was answered.
type momentCall struct {
	user     uint64
	status   int
	code     string
	runID    string
	complete bool
	usage    pricing.Usage
}

// momentBatch: two users' callers keep the writer's batches mixed until one batch carries an
// admission and both users' settlements; the server dies once its COMMIT has gone out, for
// longer than admit_timeout.
func momentBatch(t *testing.T, w *world, k *killer, trip *tripwire, g *gateway) {
	type caller struct {
		id  uint64
		key string
	}
	var users []caller
	for i := range 2 {
		u, key := w.user(fmt.Sprintf("batch-%d", i), 20, nil)
		users = append(users, caller{u.ID, key})
	}
	// Each user's ledger row, (user_id,'day',…), names no day: one read before the batch would
	// never match a batch written after a midnight.
	fired := trip.arm("price_snapshot, served_by) VALUES", "settle_token = VALUES(settle_token)",
		fmt.Sprintf("(%d,'", users[0].id), fmt.Sprintf("(%d,'", users[1].id), "COMMIT")

	ctx, stop := context.WithCancel(context.Background())
	var (
		mu    sync.Mutex
		calls []momentCall
		wg    sync.WaitGroup
	)
	for n := range 6 {
		u := users[n%2]
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				c := oneCall(g, u.key, fmt.Sprintf("batch %d %d", n, i))
				c.user = u.id
				mu.Lock()
				calls = append(calls, c)
				mu.Unlock()
			}
		})
	}
	k.at(trip, fired, "a batch's COMMIT with an admission and two users' settlements", 1500*time.Millisecond)
	// Traffic goes on a moment after the restart, then stops; every hold settles (the
	// settlements retried, the lost admissions released, or the reconciler).
	time.Sleep(500 * time.Millisecond)
	stop()
	wg.Wait()
	waitFor(t, 30*time.Second, "every hold to settle", func() bool { return w.liveHolds() == 0 })

	byStatus := map[string]int{}
	seen := map[string]bool{}
	for _, c := range calls {
		byStatus[fmt.Sprintf("%d %s", c.status, c.code)]++
		if c.runID == "" {
			continue
		}
		seen[c.runID] = true
		r := w.hold(c.runID)
		switch {
		case c.complete:
			if want := w.price.Cost(c.usage); r.ChargedMicro != want {
				t.Errorf("batch: call %s answered whole (cost %d): charged %d (%s)", c.runID, want, r.ChargedMicro, r.SettleSource.String)
			}
		case c.status == http.StatusServiceUnavailable:
			if r.ChargedMicro != 0 {
				t.Errorf("batch: call %s refused %s: charged %d (%s)", c.runID, c.code, r.ChargedMicro, r.SettleSource.String)
			}
		case c.status/100 == 2:
			t.Errorf("batch: call %s answered %d but not whole", c.runID, c.status)
		}
	}
	// A hold no caller was told of is a refused call's: charged nothing.
	var rows []holds.Run
	if err := w.db.Select(&rows, `SELECT run_id, charged_micro, settle_source FROM run_holds WHERE user_id IN (?, ?)`,
		users[0].id, users[1].id); err != nil {
		t.Fatal(err)
	}
	sources := map[string]int{}
	for _, r := range rows {
		sources[r.SettleSource.String]++
		if !seen[r.RunID] && r.ChargedMicro != 0 {
			t.Errorf("batch: hold %s no caller saw charged %d (%s)", r.RunID, r.ChargedMicro, r.SettleSource.String)
		}
	}
	t.Logf("batch moment: %d calls %v; holds by source %v", len(calls), byStatus, sources)
	if byStatus["503 billing_unavailable"] == 0 {
		t.Errorf("batch: no call was refused through an outage longer than admit_timeout: %v", byStatus)
	}
}

// oneCall sends a plain call and reads how it was answered.
func oneCall(g *gateway, key, content string) momentCall {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var c momentCall
	resp, err := do(ctx, g, key, chatBody(false, 20, content), map[string]string{"X-Fake-Chunks": "5"})
	if err != nil {
		return c
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	c.status, c.runID = resp.StatusCode, resp.Header.Get(RunIDHeaderForTests)
	var out struct {
		Usage *struct {
			Prompt     int64 `json:"prompt_tokens"`
			Completion int64 `json:"completion_tokens"`
		} `json:"usage"`
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &out) == nil {
		c.code = out.Error.Code
		if resp.StatusCode == http.StatusOK && out.Usage != nil {
			c.complete, c.usage = true, pricing.Usage{Input: out.Usage.Prompt, Output: out.Usage.Completion}
		}
	}
	return c
}

// momentRunSettle: a named run of two calls is settled on request; its settlement's COMMIT goes
// out, its reply is lost, and the server stays down past settle_timeout.
func momentRunSettle(t *testing.T, w *world, k *killer, trip *tripwire, g *gateway) {
	u, key := w.user("agent", 10, nil)
	const name = "crash-settle-run"
	var cost int64
	for i := range 2 {
		_, usage := completeCall(t, g, key, chatBody(false, 20, fmt.Sprintf("step %d", i)), map[string]string{"X-Run-Id": name})
		cost += w.price.Cost(usage)
	}
	fired := trip.arm("settle_token = VALUES(settle_token)", "'client'", "COMMIT")
	first := make(chan settleAnswer, 1)
	go func() { first <- settleOnce(g, key, name) }()
	k.at(trip, fired, "the run settle's COMMIT", 2*time.Second)
	a := <-first
	t.Logf("settle through the outage: %d %s", a.status, a.raw)
	if a.status != http.StatusServiceUnavailable && a.status != http.StatusOK {
		t.Errorf("settle through the outage: %d %s, want 503 (or 200)", a.status, a.raw)
	}
	// The agent retries.
	a = settleOnce(g, key, name)
	if a.status != http.StatusOK {
		t.Fatalf("settle retried after the restart: %d %s", a.status, a.raw)
	}
	want := pricing.FormatCredits(cost, 1000)
	if a.view.State != string(holds.StateSettled) || string(a.view.Charged) != want || a.view.Source != holds.SourceClient {
		t.Errorf("settle retried after the restart: %s, want settled by client at %s", a.raw, want)
	}
	var rows []holds.Run
	if err := w.db.Select(&rows, "SELECT run_id, state, charged_micro, settle_source FROM run_holds WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].ChargedMicro != cost || rows[0].State != holds.StateSettled {
		t.Errorf("the run's rows: %+v, want one settled at %d", rows, cost)
	}
	if got := w.ledgerUsed(u.ID); got != cost {
		t.Errorf("day ledger of the agent: %d, want %d (charged once)", got, cost)
	}
	// Again: the same answer; and the run takes no more calls.
	if b := settleOnce(g, key, name); b.status != http.StatusOK || string(b.view.Charged) != want {
		t.Errorf("settle once more: %d %s", b.status, b.raw)
	}
	resp := post(t, context.Background(), g, key, chatBody(false, 20, "after"), map[string]string{"X-Run-Id": name})
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(raw), "run_settled") {
		t.Errorf("a call of the settled run: %d %s, want 409 run_settled", resp.StatusCode, raw)
	}
}

type settleAnswer struct {
	status int
	raw    []byte
	view   runView
}

func settleOnce(g *gateway, key, name string) settleAnswer {
	req, _ := http.NewRequest(http.MethodPost, g.url+"/v1/runs/"+name+"/settle", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return settleAnswer{raw: []byte(err.Error())}
	}
	defer resp.Body.Close()
	a := settleAnswer{status: resp.StatusCode}
	a.raw, _ = io.ReadAll(resp.Body)
	_ = json.Unmarshal(a.raw, &a.view)
	return a
}

// gatewayCmd runs a gateway command on dsn and returns what it printed and how it ended.
func gatewayCmd(w *world, dsn string, args ...string) (string, error) {
	cmd := exec.Command(gatewayBin, args...)
	cmd.Env = append(os.Environ(), "MYSQL_DSN="+dsn, "REDIS_URL="+w.redisURL, "UPSTREAM_URL="+w.upstream.URL,
		"TOLLGATE_INSTANCE=operator", "TOLLGATE_REDIS_PREFIX="+w.prefix)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// asyncCmd is gatewayCmd in the background.
func asyncCmd(w *world, dsn string, args ...string) <-chan string {
	done := make(chan string, 1)
	go func() {
		out, err := gatewayCmd(w, dsn, args...)
		done <- fmt.Sprintf("%s(exit: %v)", out, err)
	}()
	return done
}

func cmdResult(t *testing.T, done <-chan string, what string) string {
	t.Helper()
	select {
	case out := <-done:
		return out
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not end within 60s", what)
		return ""
	}
}

// momentReconcile: three expired holds (one with a tally, one queued, one running without a
// tally); the pass's settlement of the tallied one commits unanswered.
func momentReconcile(t *testing.T, w *world, k *killer, trip *tripwire, dsn string) {
	ctx := context.Background()
	u, _ := w.user("reconciled", 10, nil)
	ids := map[string]holds.State{"r_crash_tallied": holds.StateRunning, "r_crash_queued": holds.StateQueued, "r_crash_lost": holds.StateRunning}
	for id, st := range ids {
		if _, err := w.store.Admit(ctx, holds.AdmitRequest{RunID: id, UserID: u.ID, Model: "fake-gpt", State: st, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.tally.Add(ctx, "r_crash_tallied", pricing.Usage{Input: 100, Output: 100}, 1_250, false); err != nil {
		t.Fatal(err)
	}
	if _, err := w.db.Exec("UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	fired := trip.arm("settle_token = VALUES(settle_token)", "'r_crash_tallied'", "COMMIT")
	done := asyncCmd(w, dsn, "reconcile", "-once", "-force", "-config", w.config)
	k.at(trip, fired, "the reconciler's settlement COMMIT", time.Second)
	out := cmdResult(t, done, "gateway reconcile")
	t.Logf("gateway reconcile -once -force through the crash: %s", out)
	if !strings.Contains(out, "exit: <nil>") {
		t.Errorf("gateway reconcile through the crash failed: %s", out)
	}
	want := map[string]struct {
		source  string
		charged int64
	}{"r_crash_tallied": {holds.SourceReconcile, 1_250}, "r_crash_queued": {holds.SourceRelease, 0},
		"r_crash_lost": {holds.SourceReconcileHold, w.hold("r_crash_lost").HeldMicro}}
	check := func(when string) {
		var sum int64
		for id, wt := range want {
			r := w.hold(id)
			sum += wt.charged
			if r.State != holds.StateSettled || r.SettleSource.String != wt.source || r.ChargedMicro != wt.charged {
				t.Errorf("%s: %s %s by %q charged %d, want %s charged %d", when, id, r.State, r.SettleSource.String, r.ChargedMicro,
					wt.source, wt.charged)
			}
		}
		if got := w.ledgerUsed(u.ID); got != sum {
			t.Errorf("%s: day ledger %d, want %d", when, got, sum)
		}
	}
	check("after the pass through the crash")
	out, err := gatewayCmd(w, w.dsn, "reconcile", "-once", "-force", "-config", w.config)
	if err != nil {
		t.Fatalf("second pass: %v\n%s", err, out)
	}
	t.Logf("second pass: %s", out)
	check("after a second pass")
}

// momentGrant: a grant's COMMIT goes out unanswered; the command's own retry, and then the
// operator's, must credit it once.
func momentGrant(t *testing.T, w *world, k *killer, trip *tripwire, dsn string) {
	u, _ := w.user("payer", 10, nil)
	fired := trip.armAfter([]string{"INSERT INTO grants"}, "COMMIT")
	args := []string{"grant", "-config", w.config, "-user", "payer", "-amount", "5", "-key", "pay-crash-1", "-reason", "top-up"}
	done := asyncCmd(w, dsn, args...)
	k.at(trip, fired, "the grant's COMMIT", time.Second)
	out := cmdResult(t, done, "gateway grant")
	t.Logf("gateway grant through the crash: %s", out)
	if !strings.Contains(out, "exit: <nil>") {
		t.Errorf("gateway grant through the crash failed: %s", out)
	}
	again, err := gatewayCmd(w, w.dsn, args...)
	if err != nil || !strings.Contains(again, "granted before") {
		t.Errorf("the same grant again: %v\n%s", err, again)
	}
	var prepaid int64
	var grants int
	if err := w.db.Get(&prepaid, "SELECT prepaid_micro FROM users WHERE id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	if err := w.db.Get(&grants, "SELECT COUNT(*) FROM grants WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	if prepaid != 5_000 || grants != 1 {
		t.Errorf("after the grant through the crash and its retry: prepaid %d µUSD in %d grants, want 5000 in 1", prepaid, grants)
	}
}

// momentPrune: five settled runs a month old; the prune's first batch (of two) commits
// unanswered.
func momentPrune(t *testing.T, w *world, k *killer, trip *tripwire, dsn string) {
	ctx := context.Background()
	u, _ := w.user("old-timer", 10, nil)
	for i := range 5 {
		id := fmt.Sprintf("r_crash_old_%d", i)
		if _, err := w.store.Admit(ctx, holds.AdmitRequest{RunID: id, UserID: u.ID, Model: "fake-gpt", State: holds.StateRunning, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if _, err := w.store.Settle(ctx, holds.Settlement{RunID: id, UserID: u.ID, CostMicro: int64(1000 * (i + 1)), Calls: 1,
			Model: "fake-gpt", Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
	// A month ago, ledger and all.
	for _, q := range []string{
		"UPDATE run_holds SET created_at = created_at - INTERVAL 30 DAY, settled_at = settled_at - INTERVAL 30 DAY WHERE user_id = ?",
		"UPDATE usage_days SET day = day - INTERVAL 30 DAY WHERE user_id = ?",
	} {
		if _, err := w.db.Exec(q, u.ID); err != nil {
			t.Fatal(err)
		}
	}
	type sums struct {
		Charged int64 `db:"charged"`
		Runs    int64 `db:"runs"`
		Calls   int64 `db:"calls"`
	}
	read := func() sums {
		var s sums
		if err := w.db.Get(&s, `SELECT CAST(SUM(c) AS SIGNED) AS charged, CAST(SUM(r) AS SIGNED) AS runs, CAST(SUM(n) AS SIGNED) AS calls FROM (
			SELECT charged_micro AS c, 1 AS r, calls AS n FROM run_holds WHERE user_id = ? AND state = 'settled'
			UNION ALL SELECT charged_micro, runs, calls FROM pruned_runs WHERE user_id = ?) x`, u.ID, u.ID); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := read()
	fired := trip.armAfter([]string{"INSERT INTO pruned_runs"}, "COMMIT")
	args := []string{"prune", "-config", w.config, "-days", "8", "-batch", "2"}
	done := asyncCmd(w, dsn, args...)
	k.at(trip, fired, "the prune's first batch COMMIT", time.Second)
	out := cmdResult(t, done, "gateway prune")
	t.Logf("gateway prune through the crash: %s", out)
	if !strings.Contains(out, "exit: <nil>") {
		t.Errorf("gateway prune through the crash failed: %s", out)
	}
	again, err := gatewayCmd(w, w.dsn, args...)
	if err != nil || !strings.Contains(again, "pruned 0 settled runs") {
		t.Errorf("prune again: %v\n%s", err, again)
	}
	var left int
	if err := w.db.Get(&left, "SELECT COUNT(*) FROM run_holds WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	if after := read(); after != before || left != 0 {
		t.Errorf("prune through the crash: sums %+v before, %+v after, %d runs left", before, after, left)
	}
}
