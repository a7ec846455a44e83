package proxy_test

import (
	"context"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestMetricsAgreeWithTheBooksAfterAMixedWorkload runs what a day of callers sends — calls
// answered whole and streamed, one cut short by its caller, upstream refusals and broken
// streams, an Idempotency-Key retried and reused, a named run settled on request and one
// abandoned for the reconciler, a hold whose usage was lost, and refusals 400, 401, 402, 409,
// 422 and 429 — and checks every series that speaks of money or of what callers saw against
// the database and the answers: charged µUSD and billed tokens by source and kind against the
// settled rows, settlements (the gateway's and its reconciler's) by source against
// settle_source, requests by route and code against the statuses answered, and duplicates
// against the duplicate-family answers.
func TestMetricsAgreeWithTheBooksAfterAMixedWorkload(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	broke, brokeKey := h.user("standard")
	var none int64
	if err := h.store.SetUserLimits(context.Background(), broke.ID, &none, nil, nil); err != nil {
		t.Fatal(err)
	}
	narrow, narrowKey := h.user("standard")
	one := 1
	if err := h.store.SetUserLimits(context.Background(), narrow.ID, nil, &one, nil); err != nil {
		t.Fatal(err)
	}

	const route = "/v1/chat/completions"
	seen := map[string]int64{} // the codes callers were answered, as requests_total labels them
	dups := map[string]int64{} // duplicate-family answers, by code
	call := func(k, body string, hdr map[string]string, want int) answer {
		t.Helper()
		a := send(h.gw.URL, k, body, hdr)
		if a.err != nil || a.status != want {
			t.Fatalf("%s %v: %d %s (%v), want %d", body, hdr, a.status, a.body, a.err, want)
		}
		seen[`code="`+strconv.Itoa(a.status)+`",route="`+route+`"`]++
		return a
	}

	call(key, chatBody, nil, 200)
	call(key, streamBody, nil, 200)
	call(key, chatBody, map[string]string{fakellm.HeaderStatus: "500"}, 502)
	call(key, chatBody, map[string]string{fakellm.HeaderStatus: "400"}, 400)
	call(key, streamBody, map[string]string{fakellm.HeaderErrorAfter: "2"}, 200)
	call(key, streamBody, map[string]string{fakellm.HeaderDropAfter: "2"}, 200)
	// Cut short by its caller: a cancel. The caller saw its 200.
	left := h.post(key, route, streamBody, slowStream(50, nil))
	firstEvent(t, left)
	left.Body.Close()
	seen[`code="200",route="`+route+`"`]++
	// An Idempotency-Key: answered, replayed, then reused for another body.
	idem := map[string]string{"Idempotency-Key": "books-1"}
	call(key, chatBody, idem, 200)
	if a := call(key, chatBody, idem, 200); a.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry not replayed: %v", a.header)
	}
	dups["replayed"]++
	call(key, streamBody, idem, 422)
	dups["idempotency_key_reused"]++
	// The same request again while it runs: a duplicate, answered without running.
	first := h.post(key, route, streamBody, slowStream(200, nil))
	firstEvent(t, first)
	a := call(key, streamBody, nil, 409)
	dups[errorCode(t, a.body)]++
	first.Body.Close()
	seen[`code="200",route="`+route+`"`]++
	// A named run of two calls, settled, then refused.
	run := map[string]string{"X-Run-Id": "books-run"}
	call(key, chatBody, run, 200)
	call(key, streamBody, run, 200)
	h.settled()
	if code, body := h.settleRun(key, "books-run"); code != http.StatusOK {
		t.Fatalf("settle: %d %s", code, body)
	}
	call(key, chatBody, run, 409)
	// Refusals.
	call(key, `{"model":`, nil, 400)
	call("sk-wrong-0123456789", chatBody, nil, 401)
	call(brokeKey, chatBody, nil, 402)
	busy := h.post(narrowKey, route, streamBody, slowStream(200, nil))
	firstEvent(t, busy)
	call(narrowKey, chatBody, nil, 429)
	busy.Body.Close()
	seen[`code="200",route="`+route+`"`]++
	// A named run its agent abandoned, reconciled from its tally once it expires.
	call(key, chatBody, map[string]string{"X-Run-Id": "books-abandoned"}, 200)
	h.settled()
	// A hold whose process died before it tallied anything: charged what it held.
	lost, err := h.store.AdmitBatch(context.Background(), []holds.AdmitRequest{{RunID: "r_books_lost", UserID: u.ID, Model: "fake-gpt",
		State: holds.StateRunning, TTL: time.Minute, Fresh: true, Token: "books-lost"}})
	if err != nil || lost[0].Err != nil {
		t.Fatalf("admit the lost hold: %v %+v", err, lost)
	}
	if _, err := h.db.Exec(`UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE state <> 'settled'`); err != nil {
		t.Fatal(err)
	}
	// Wired as cmd/gateway wires its reconciler to the process's metrics.
	rec := holds.NewReconciler(holds.ReconcilerConfig{Store: h.store, Usage: tallyUsage{h.tally},
		Leases: noLeases{}, Lock: alwaysLocked{}, Log: zap.NewNop(), ExtendBy: time.Minute,
		OnOutcome: func(outcome string) {
			h.metrics.Reconciled.WithLabelValues(outcome).Inc()
			if outcome == holds.OutcomeChargedHeld {
				h.metrics.ReconcileHold.Inc()
			}
		}})
	if _, err := rec.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	h.settled()

	// Money: what the settled rows charged and billed, by source and kind.
	var rows []struct {
		Source  string `db:"src"`
		Runs    int64  `db:"runs"`
		Charged int64  `db:"charged"`
	}
	if err := h.db.Select(&rows, `SELECT settle_source AS src, COUNT(*) AS runs, SUM(charged_micro) AS charged
		FROM run_holds WHERE state = 'settled' GROUP BY settle_source`); err != nil {
		t.Fatal(err)
	}
	if _, live := h.holdCount(); live != 0 {
		t.Fatalf("%d holds left unsettled", live)
	}
	charged := h.metricSeries("tollgate_charged_micro_usd_total")
	settlements := h.metricSeries("tollgate_settlements_total")
	reconciled := h.metricSeries("tollgate_reconciled_total")
	bySource := map[string]int64{}
	for _, r := range rows {
		bySource[r.Source] = r.Runs
		if got := charged[`source="`+r.Source+`"`]; got != r.Charged {
			t.Errorf("charged_micro_usd_total{source=%q} = %d, the rows settled so charged %d", r.Source, got, r.Charged)
		}
	}
	for _, src := range []string{holds.SourceComplete, holds.SourceCancel, holds.SourceUpstreamError, holds.SourceStreamError,
		holds.SourceClient, holds.SourceReconcile, holds.SourceReconcileHold} {
		if bySource[src] == 0 {
			t.Errorf("the workload settled no run by %s: %v", src, bySource)
		}
	}
	// The gateway's own settlements by source; its reconciler's by outcome (README: Where a
	// charge came from).
	fromReconciler := map[string]string{holds.SourceReconcile: "reconcile", holds.SourceReconcileHold: "reconcile_hold"}
	for src, n := range bySource {
		if outcome, ok := fromReconciler[src]; ok {
			if got := reconciled[`outcome="`+outcome+`"`]; got != n {
				t.Errorf("reconciled_total{outcome=%q} = %d, %d rows settled %s", outcome, got, n, src)
			}
			continue
		}
		if got := settlements[`applied="true",source="`+src+`"`]; got != n {
			t.Errorf("settlements_total{source=%q,applied=true} = %d, %d rows settled so", src, got, n)
		}
	}
	if got := h.metric("tollgate_reconcile_hold_total"); got != strconv.FormatInt(bySource[holds.SourceReconcileHold], 10) {
		t.Errorf("reconcile_hold_total = %s, %d rows charged at their hold", got, bySource[holds.SourceReconcileHold])
	}
	var in, cacheRead, cacheWrite, out int64
	if err := h.db.QueryRow(`SELECT SUM(in_tok), SUM(cache_read_tok), SUM(cache_write_tok), SUM(out_tok) FROM run_holds
		WHERE state = 'settled'`).Scan(&in, &cacheRead, &cacheWrite, &out); err != nil {
		t.Fatal(err)
	}
	tokens := h.metricSeries("tollgate_billed_tokens_total")
	for kind, want := range map[string]int64{"input": in, "cache_read": cacheRead, "cache_write": cacheWrite, "output": out} {
		if got := tokens[`kind="`+kind+`"`]; got != want {
			t.Errorf("billed_tokens_total{kind=%q} = %d, the settled rows billed %d", kind, got, want)
		}
	}

	// What callers saw.
	requests := h.metricSeries("tollgate_requests_total")
	if !equalCounts(requests, seen) {
		t.Errorf("requests_total %v, callers were answered %v", requests, seen)
	}
	if got := h.metricSeries("tollgate_duplicates_total"); !equalCounts(got, labelled("answer", dups)) {
		t.Errorf("duplicates_total %v, want %v", got, labelled("answer", dups))
	}
	if got := h.metric("tollgate_settle_failures_total"); got != "0" {
		t.Errorf("settle_failures_total = %s, nothing failed", got)
	}
}

// TestDocumentedMetricsAreServed: every tollgate_ series README names is registered, with the
// labels README gives it, and every series registered is in README.
func TestDocumentedMetricsAreServed(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]map[string]bool{}
	for _, m := range regexp.MustCompile(`tollgate_[a-z0-9_]+(\{[^}]*\})?`).FindAllStringSubmatch(string(readme), -1) {
		name, labels := strings.TrimSuffix(m[0], m[1]), strings.Trim(m[1], "{}")
		if documented[name] == nil {
			documented[name] = map[string]bool{}
		}
		for _, l := range strings.Split(labels, ",") {
			if l, _, _ = strings.Cut(l, "="); l != "" {
				documented[name][l] = true
			}
		}
	}
	served := map[string][]string{}
	m := proxy.NewMetrics(prometheus.NewRegistry())
	descs := make(chan *prometheus.Desc, 64)
	// Every series of Metrics, found by its fields: one added there is checked here without
	// being listed (a list here missed tollgate_error_answers_total).
	fields := reflect.ValueOf(m).Elem()
	for i := range fields.NumField() {
		if !fields.Type().Field(i).IsExported() {
			continue
		}
		if c, ok := fields.Field(i).Interface().(prometheus.Collector); ok {
			c.Describe(descs)
		}
	}
	close(descs)
	descRE := regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{?\[?([^}\]]*)`)
	for d := range descs {
		f := descRE.FindStringSubmatch(d.String())
		if f == nil {
			t.Fatalf("descriptor %s", d)
		}
		served[f[1]] = strings.FieldsFunc(f[2], func(r rune) bool { return r == ',' || r == ' ' })
	}
	for name, labels := range served {
		doc, ok := documented[name]
		if !ok {
			t.Errorf("%s is served, README does not name it", name)
			continue
		}
		sort.Strings(labels)
		var want []string
		for l := range doc {
			want = append(want, l)
		}
		sort.Strings(want)
		if strings.Join(labels, ",") != strings.Join(want, ",") {
			t.Errorf("%s: served with labels %v, README gives %v", name, labels, want)
		}
	}
	for name := range documented {
		if _, ok := served[name]; !ok && !strings.HasPrefix(name, "tollgate_migrate") {
			t.Errorf("README names %s, nothing serves it", name)
		}
	}
}

// labelled is counts keyed by one label's series.
func labelled(label string, counts map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range counts {
		out[label+`="`+k+`"`] = v
	}
	return out
}

// equalCounts compares two series maps, leaving out series at 0.
func equalCounts(a, b map[string]int64) bool {
	for k, v := range a {
		if v != 0 && b[k] != v {
			return false
		}
	}
	for k, v := range b {
		if v != 0 && a[k] != v {
			return false
		}
	}
	return true
}
