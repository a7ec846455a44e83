package holds_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/pricing"
)

// booksKey is one usage report row's place: user, UTC day of settlement, model.
type booksKey struct {
	user       uint64
	day, model string
}

// booksFixture keeps, beside the database, the test's own books: every settlement's outcome
// under the day it was settled on, by the database clock the settling store stands at.
type booksFixture struct {
	t      *testing.T
	dsn    string
	stores map[time.Time]*holds.Store
	rows   map[booksKey]*holds.UsageRow
	n      int
}

// at is a store whose database clock stands still at ts.
func (f *booksFixture) at(ts time.Time) *holds.Store {
	if st, ok := f.stores[ts]; ok {
		return st
	}
	st := holds.NewStore(openAt(f.t, f.dsn, ts), acctPlans(), "standard", zaptest.NewLogger(f.t, zaptest.Level(zap.WarnLevel)))
	f.stores[ts] = st
	return st
}

func (f *booksFixture) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	f.t.Cleanup(cancel)
	return ctx
}

// run admits a run at admitAt and settles it at settleAt, and books what the settlement says
// it did under settleAt's UTC day.
func (f *booksFixture) run(u holds.User, admitAt, settleAt time.Time, model string, cost int64, usage pricing.Usage, calls int, estimated bool) {
	f.t.Helper()
	f.n++
	id := fmt.Sprintf("r_books_%04d", f.n)
	if _, err := f.at(admitAt).Admit(f.ctx(), holds.AdmitRequest{RunID: id, UserID: u.ID, Model: model, State: holds.StateRunning,
		TTL: time.Minute}); err != nil {
		f.t.Fatalf("admit %s at %v: %v", id, admitAt, err)
	}
	res, err := f.at(settleAt).Settle(f.ctx(), holds.Settlement{RunID: id, CostMicro: cost, Calls: calls, Usage: usage, Model: model,
		Source: holds.SourceComplete, Estimated: estimated})
	if err != nil || !res.Applied {
		f.t.Fatalf("settle %s at %v: %+v, %v", id, settleAt, res, err)
	}
	k := booksKey{u.ID, settleAt.UTC().Format(time.DateOnly), model}
	r := f.rows[k]
	if r == nil {
		r = &holds.UsageRow{UserID: u.ID, UserName: u.Name, Day: k.day, Model: model}
		f.rows[k] = r
	}
	r.Runs++
	if res.ChargedMicro > 0 {
		r.ChargedRuns++
	}
	if estimated {
		r.EstimatedRuns++
	}
	r.Calls += int64(calls)
	r.InTok += usage.Input
	r.CacheReadTok += usage.CacheRead
	r.CacheWriteTok += usage.CacheWrite
	r.OutTok += usage.Output
	r.CacheWrite1hTok += usage.CacheWrite1h
	r.AudioInTok += usage.AudioInput
	r.AudioOutTok += usage.AudioOutput
	r.CostMicro += res.CostMicro
	r.ChargedMicro += res.ChargedMicro
	r.AllowancePartMicro += res.AllowancePart
	r.PrepaidPartMicro += res.PrepaidPart
}

// expected is the report of the books over the UTC days [from, to] for user (0: all), as
// the report rows it: one row per user, day and model, a user's day past MaxPrunedModels
// models keeping those charged most (then cost, tokens, model) and summing the rest under
// FoldedModel; ordered by user name, day and model bytes.
func (f *booksFixture) expected(from, to string, user uint64) []holds.UsageRow {
	byDay := map[booksKey][]holds.UsageRow{}
	for k, r := range f.rows {
		if k.day < from || k.day > to || (user != 0 && k.user != user) {
			continue
		}
		d := booksKey{user: k.user, day: k.day}
		byDay[d] = append(byDay[d], *r)
	}
	var out []holds.UsageRow
	for _, rows := range byDay {
		var named []holds.UsageRow
		var folded *holds.UsageRow // runs recorded without a model, and the models past the bound
		for _, r := range rows {
			if r.Model == holds.FoldedModel {
				folded = &r
				continue
			}
			named = append(named, r)
		}
		slices.SortFunc(named, func(a, b holds.UsageRow) int {
			return cmp.Or(cmp.Compare(b.ChargedMicro, a.ChargedMicro), cmp.Compare(b.CostMicro, a.CostMicro),
				cmp.Compare(b.InTok+b.CacheReadTok+b.CacheWriteTok+b.OutTok, a.InTok+a.CacheReadTok+a.CacheWriteTok+a.OutTok),
				cmp.Compare(a.Model, b.Model))
		})
		if len(named) > holds.MaxPrunedModels {
			if folded == nil {
				folded = &holds.UsageRow{UserID: named[0].UserID, UserName: named[0].UserName, Day: named[0].Day, Model: holds.FoldedModel}
			}
			for _, r := range named[holds.MaxPrunedModels:] {
				addRow(folded, r)
			}
			named = named[:holds.MaxPrunedModels]
		}
		out = append(out, named...)
		if folded != nil {
			out = append(out, *folded)
		}
	}
	slices.SortFunc(out, func(a, b holds.UsageRow) int {
		return cmp.Or(cmp.Compare(a.UserName, b.UserName), cmp.Compare(a.Day, b.Day), cmp.Compare(a.Model, b.Model))
	})
	return out
}

// addRow adds r's counts and amounts into u (the test's own sum, not the package's).
func addRow(u *holds.UsageRow, r holds.UsageRow) {
	u.Runs += r.Runs
	u.ChargedRuns += r.ChargedRuns
	u.EstimatedRuns += r.EstimatedRuns
	u.Calls += r.Calls
	u.InTok += r.InTok
	u.CacheReadTok += r.CacheReadTok
	u.CacheWriteTok += r.CacheWriteTok
	u.OutTok += r.OutTok
	u.CacheWrite1hTok += r.CacheWrite1hTok
	u.AudioInTok += r.AudioInTok
	u.AudioOutTok += r.AudioOutTok
	u.CostMicro += r.CostMicro
	u.ChargedMicro += r.ChargedMicro
	u.AllowancePartMicro += r.AllowancePartMicro
	u.PrepaidPartMicro += r.PrepaidPartMicro
}

// userDaySums is rows summed per user and day.
func userDaySums(rows []holds.UsageRow) map[booksKey]holds.UsageRow {
	out := map[booksKey]holds.UsageRow{}
	for _, r := range rows {
		k := booksKey{user: r.UserID, day: r.Day}
		s := out[k]
		addRow(&s, r)
		out[k] = s
	}
	return out
}

// TestUsageReportAgreesWithTheBooks: a billing team invoices from the usage report, so each of
// its figures must equal, to the micro-USD and the token, what the settlements charged and
// the day ledger holds — over runs settled at the first and the last microsecond of a UTC
// day, a run held before midnight and settled after it, models told apart byte for byte,
// estimated runs, discounts (of 100 % too), charges taken partly from prepaid credits,
// releases at 0, a run recorded without a model, a user's day of more models than a report
// row each (the places going by charge, list cost, tokens and name), users listed by name
// whatever their ids, and days pruned whole, in part (the prune's cutoff falls inside a day)
// or not at all, for every user and for all, over single days, ranges and days with no runs. The expected report is the test's own books, and each
// day's ledger is read from usage_days and set against them.
func TestUsageReportAgreesWithTheBooks(t *testing.T) {
	f := &booksFixture{t: t, dsn: testenv.MySQLDSN(t), stores: map[time.Time]*holds.Store{},
		rows: map[booksKey]*holds.UsageRow{}}
	plain := testenv.Open(t, f.dsn)
	t.Cleanup(func() { testenv.CheckLedger(t, plain) })
	d0 := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	st := f.at(d0)
	mk := func(name, plan string) holds.User {
		u, err := st.CreateUser(f.ctx(), name, plan)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := st.Grant(f.ctx(), holds.GrantRequest{UserID: u.ID, AmountMicro: 500_000_000, IdempotencyKey: "topup-" + name,
			Reason: "test"}); err != nil {
			t.Fatal(err)
		}
		return u
	}
	// Created out of their names' order: the report is ordered by name, not id.
	gamma, alpha, delta, beta := mk("gamma", "standard"), mk("alpha", "standard"), mk("delta", "standard"), mk("beta", "guest")
	small := int64(60_000) // alpha's days run past their allowance into prepaid credits
	if err := st.SetUserLimits(f.ctx(), alpha.ID, &small, nil, nil); err != nil {
		t.Fatal(err)
	}

	rng := rand.New(rand.NewPCG(4, 2026))
	models := []string{"m-a", "m-A", "m-a ", "m-b"} // byte for byte, four models
	usage := func(cost int64) pricing.Usage {
		if cost == 0 && rng.IntN(2) == 0 {
			return pricing.Usage{}
		}
		cw := rng.Int64N(500)
		return pricing.Usage{Input: 100 + rng.Int64N(5_000), CacheRead: rng.Int64N(3_000), CacheWrite: cw, CacheWrite1h: cw / 2,
			Output: 10 + rng.Int64N(900), AudioInput: rng.Int64N(50), AudioOutput: rng.Int64N(5)}
	}
	some := func(u holds.User, at time.Time) {
		for range 1 + rng.IntN(2) {
			cost := rng.Int64N(40_000)
			if rng.IntN(5) == 0 {
				cost = 0 // a release
			}
			f.run(u, at, at, models[rng.IntN(len(models))], cost, usage(cost), 1+rng.IntN(4), rng.IntN(4) == 0)
		}
	}
	for d := range 4 {
		day := d0.AddDate(0, 0, d)
		instants := []time.Time{day, day.Add(9*time.Hour + 30*time.Minute), day.Add(12 * time.Hour),
			day.Add(24*time.Hour - time.Microsecond)}
		for _, at := range instants {
			for _, u := range []holds.User{alpha, beta, gamma} {
				some(u, at)
			}
		}
		// Held before midnight, settled after it: the next day's.
		eve, morning := day.Add(24*time.Hour-100*time.Millisecond), day.Add(24*time.Hour+100*time.Millisecond)
		f.run(alpha, eve, morning, "m-a", 12_345, usage(12_345), 3, false)
		f.run(beta, eve, morning, "m-b", 7_000, usage(7_000), 1, true)
	}
	// One user's day of more models than it keeps rows for; some refused (0), some charged.
	flood := d0.AddDate(0, 0, 1).Add(15 * time.Hour)
	for i := range holds.MaxPrunedModels + 7 {
		cost := int64(0)
		if i%3 == 0 {
			cost = int64(1_000 + rng.IntN(3)*100) // ties, broken by cost, tokens and name
		}
		f.run(gamma, flood, flood, fmt.Sprintf("f-%03d", i), cost, usage(cost), 1, false)
	}
	// A run recorded without a model, dearer than any: its row is FoldedModel's, which takes
	// none of the places of the models kept by name.
	f.run(gamma, flood, flood, "", 30_000, usage(30_000), 1, false)
	// A user charged nothing (a discount of 100 %): the places go by list cost, then tokens.
	free := 10_000
	if err := st.SetUserLimits(f.ctx(), delta.ID, nil, nil, &free); err != nil {
		t.Fatal(err)
	}
	for i := range holds.MaxPrunedModels + 7 {
		cost := int64(500 + rng.IntN(3)*100)
		f.run(delta, flood, flood, fmt.Sprintf("g-%03d", i), cost, usage(cost), 1, false)
	}

	days := func(from, to int) (time.Time, time.Time) { return d0.AddDate(0, 0, from), d0.AddDate(0, 0, to) }
	ranges := [][2]int{{-1, -1}, {0, 0}, {1, 1}, {2, 2}, {3, 3}, {4, 4}, {5, 5}, {0, 4}, {1, 2}, {-3, 9}, {2, 4}}
	users := []holds.User{{}, alpha, beta, gamma, delta}
	check := func(when string, foldedExact bool) {
		t.Helper()
		rep := st // any store reads the same
		for _, rg := range ranges {
			from, to := days(rg[0], rg[1])
			for _, u := range users {
				got, err := rep.Usage(f.ctx(), from, to, u.ID)
				if err != nil {
					t.Fatalf("%s: report %v..%v user %d: %v", when, from, to, u.ID, err)
				}
				f.compare(when, got, f.expected(from.Format(time.DateOnly), to.Format(time.DateOnly), u.ID), u.ID, foldedExact)
			}
		}
	}
	f.checkLedger(plain)
	check("before the prune", true)

	// The row bound: a report of exactly as many rows as it allows is served whole, and one
	// of a row more is refused, never cut short.
	from, to := days(0, 4)
	n := len(f.expected(from.Format(time.DateOnly), to.Format(time.DateOnly), 0))
	for _, bound := range []int{n, n - 1} {
		restore := holds.SetMaxReportRows(bound)
		rep, err := st.Usage(f.ctx(), from, to, 0)
		restore()
		if bound == n && (err != nil || len(rep.Rows) != n) {
			t.Errorf("report of %d rows under a bound of %d: %d rows, %v; want it whole", n, bound, len(rep.Rows), err)
		}
		if bound < n && !errors.Is(err, holds.ErrBadFilter) {
			t.Errorf("report of %d rows under a bound of %d: %d rows, %v; want ErrBadFilter", n, bound, len(rep.Rows), err)
		}
	}

	// A prune whose cutoff is noon of the third day: the days before it go whole, the third
	// day's morning goes and its noon (settled at the cutoff itself) stays, in small batches.
	pruneAt := d0.AddDate(0, 0, 2).Add(12*time.Hour + holds.MinPruneAge)
	res, err := f.at(pruneAt).PruneSettled(f.ctx(), holds.MinPruneAge, 7)
	if err != nil || res.Runs == 0 {
		t.Fatalf("prune: %+v, %v", res, err)
	}
	var kept, pruned int
	if err := plain.GetContext(f.ctx(), &kept, "SELECT COUNT(*) FROM run_holds WHERE settled_at >= ? AND settled_at < ?",
		d0.AddDate(0, 0, 2), d0.AddDate(0, 0, 3)); err != nil {
		t.Fatal(err)
	}
	if err := plain.GetContext(f.ctx(), &pruned, "SELECT COUNT(*) FROM pruned_runs WHERE day = ?", d0.AddDate(0, 0, 2)); err != nil {
		t.Fatal(err)
	}
	if kept == 0 || pruned == 0 {
		t.Fatalf("the third day has %d runs kept and %d pruned rows; want it pruned in part", kept, pruned)
	}
	// A pruned day past MaxPrunedModels keeps its models as the prune chose them: its rows
	// are compared by their sums only.
	check("after the prune", false)
}

// compare sets a report against the books: every row (a folded user's day by its sums only
// unless foldedExact), the totals, and the ledger it shows.
func (f *booksFixture) compare(when string, got holds.UsageReport, want []holds.UsageRow, user uint64, foldedExact bool) {
	t := f.t
	t.Helper()
	where := fmt.Sprintf("%s: report %s..%s user %d", when, got.From, got.To, user)
	folded := map[booksKey]bool{}
	for _, r := range want {
		if r.Model == holds.FoldedModel {
			folded[booksKey{user: r.UserID, day: r.Day}] = true
		}
	}
	exact := func(rows []holds.UsageRow) []holds.UsageRow {
		var out []holds.UsageRow
		for _, r := range rows {
			if foldedExact || !folded[booksKey{user: r.UserID, day: r.Day}] {
				out = append(out, r)
			}
		}
		return out
	}
	if g, w := exact(got.Rows), exact(want); fmt.Sprintf("%+v", g) != fmt.Sprintf("%+v", w) {
		t.Errorf("%s: rows\n%+v\nwant\n%+v", where, g, w)
	}
	gs, ws := userDaySums(got.Rows), userDaySums(want)
	if fmt.Sprint(gs) != fmt.Sprint(ws) {
		t.Errorf("%s: sums by user and day\n%v\nwant\n%v", where, gs, ws)
	}
	for k := range folded {
		n := 0
		for _, r := range got.Rows {
			if r.UserID == k.user && r.Day == k.day {
				n++
			}
		}
		if n > holds.MaxPrunedModels+1 {
			t.Errorf("%s: %d rows for user %d on %s; want at most %d", where, n, k.user, k.day, holds.MaxPrunedModels+1)
		}
	}
	var tot holds.UsageRow
	for _, r := range want {
		addRow(&tot, r)
	}
	if got.Totals != tot {
		t.Errorf("%s: totals %+v, want %+v", where, got.Totals, tot)
	}
	if got.LedgerMicro != tot.ChargedMicro || got.LedgerRuns != tot.ChargedRuns {
		t.Errorf("%s: ledger %d over %d runs, want %d over %d", where, got.LedgerMicro, got.LedgerRuns, tot.ChargedMicro, tot.ChargedRuns)
	}
}

// checkLedger sets usage_days, read directly, against the books' charges per user and day.
func (f *booksFixture) checkLedger(db interface {
	SelectContext(context.Context, any, string, ...any) error
}) {
	t := f.t
	t.Helper()
	var rows []struct {
		UserID uint64 `db:"user_id"`
		Day    string `db:"day"`
		Used   int64  `db:"used_micro"`
		Runs   int64  `db:"run_count"`
	}
	if err := db.SelectContext(f.ctx(), &rows, "SELECT user_id, DATE_FORMAT(day, '%Y-%m-%d') AS day, used_micro, run_count FROM usage_days"); err != nil {
		t.Fatal(err)
	}
	got := map[booksKey][2]int64{}
	for _, r := range rows {
		got[booksKey{user: r.UserID, day: r.Day}] = [2]int64{r.Used, r.Runs}
	}
	want := map[booksKey][2]int64{}
	for k, r := range f.rows {
		d := booksKey{user: k.user, day: k.day}
		if r.ChargedMicro > 0 {
			w := want[d]
			want[d] = [2]int64{w[0] + r.ChargedMicro, w[1] + r.ChargedRuns}
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("day ledger %v, want the books' %v", got, want)
	}
}

// TestUsageReportRangeEdges: a report covers at most maxReportDays (366) days, both ends
// included, and its days must lie between 0001-01-01 and 9999-12-30 (README, Operating it):
// each edge is served and one day past it refused, never shortened.
func TestUsageReportRangeEdges(t *testing.T) {
	f := newAcctFixture(t)
	d := func(s string) time.Time {
		t.Helper()
		v, err := time.Parse(time.DateOnly, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, c := range []struct {
		from, to string
		ok       bool
	}{
		{"2025-01-01", "2026-01-01", true},  // 366 days
		{"2025-01-01", "2026-01-02", false}, // 367
		{"2024-01-01", "2024-12-31", true},  // a leap year's 366
		{"2024-01-01", "2025-01-01", false}, // 367
		{"0001-01-01", "0001-01-01", true},  // the first day a DATETIME holds
		{"9999-12-30", "9999-12-30", true},  // the last whose end is one
		{"9999-12-30", "9999-12-31", false}, // its end is past 9999
		{"2026-03-08", "2026-03-07", false}, // reversed
		{"2026-03-08", "2026-03-08", true},  // one day
		{"0001-01-01", "0001-12-31", true},  // 365 days of year 1
		{"9999-01-01", "9999-12-30", true},  // 364 days of year 9999
	} {
		rep, err := f.store.Usage(f.ctx(), d(c.from), d(c.to), 0)
		switch {
		case c.ok && (err != nil || rep.From != c.from || rep.To != c.to):
			t.Errorf("report %s..%s: %s..%s, %v; want it served", c.from, c.to, rep.From, rep.To, err)
		case !c.ok && !errors.Is(err, holds.ErrBadFilter):
			t.Errorf("report %s..%s: %s..%s, %v; want ErrBadFilter", c.from, c.to, rep.From, rep.To, err)
		}
	}
}

// TestUsageReportLogsALedgerItDisagreesWith: a report whose rows disagree with the day ledger
// has found a bug, and says so at error level, whether the charges or only the count of
// charged runs differ. The ledger is made to disagree by hand, then put back before the
// fixture's audit.
func TestUsageReportLogsALedgerItDisagreesWith(t *testing.T) {
	f := newAcctFixture(t)
	core, logs := observer.New(zap.ErrorLevel)
	st := holds.NewStore(f.db, acctPlans(), "standard", zap.New(core))
	u := f.user("lena", "standard")
	f.admit(u, "r_1")
	f.settle("r_1", 2_000)
	skew := func(micro, runs int) {
		t.Helper()
		if _, err := f.db.ExecContext(f.ctx(), "UPDATE usage_days SET used_micro = used_micro + ?, run_count = run_count + ? WHERE user_id = ?",
			micro, runs, u.ID); err != nil {
			t.Fatal(err)
		}
	}
	// The day the call settled on, not st.Today: midnight may have passed since.
	today, err := testenv.SettledDay(f.ctx(), f.db, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name        string
		micro, runs int
	}{{"agreeing", 0, 0}, {"charges", 1_000, 0}, {"runs", 0, 1}} {
		skew(c.micro, c.runs)
		rep, err := st.Usage(f.ctx(), today, today, 0)
		skew(-c.micro, -c.runs)
		if err != nil || rep.LedgerMicro != 2_000+int64(c.micro) || rep.LedgerRuns != 1+int64(c.runs) {
			t.Fatalf("%s: report %+v, %v", c.name, rep, err)
		}
		n := 0
		for _, e := range logs.TakeAll() {
			if e.Message == "usage report disagrees with the day ledger" {
				n++
			}
		}
		if want := c.micro != 0 || c.runs != 0; (n == 1) != want || n > 1 {
			t.Errorf("ledger skewed in %s: %d error logs of the disagreement; want one: %v", c.name, n, want)
		}
	}
}
