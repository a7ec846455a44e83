package proxy_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/plans"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/proxy"
)

// TestSessionMessageSupersededWhileItsClaimRetriesIsAnsweredSuperseded: a session's message
// R whose claim took the session from a running message A and committed with its COMMIT reply
// lost is the session's current run while the claim backs off before its retry. A newer
// message C of the session claims it then, replaces R and cancels it: R's retry ends on its
// cancelled context. R was answered 499 client_closed_request, as a caller that left, without
// X-Should-Retry: false — an SDK sent it again, and the old message replaced the newer one. It
// is now answered 409 superseded, not to be retried, as a message superseded at any other step
// is. And A, which R's committed claim replaced, was never told to stop: C's claim found R,
// not A, and R's claim answered nothing. It ran to its end and was charged in full beside the
// newer messages; it is now stopped once the database answers again.
func TestSessionMessageSupersededWhileItsClaimRetriesIsAnsweredSuperseded(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	sc := newClaimLostScene(t, zap.New(core), func(h *harness) runstate.Keys { return h.keys })
	var r string
	if err := sc.plain.Get(&r, "SELECT current_run_id FROM sessions WHERE user_id = ?", sc.userID); err != nil {
		t.Fatal(err)
	}
	// C, through a gateway that reaches the database, replaces R and cancels it.
	c := sendOK(t, "C", sc.other, sc.key, `{"model":"fake-gpt","messages":[{"role":"user","content":"C: a third question"}]}`, sc.session)
	// R's claim has given up (its refusal is logged before anything needs the database).
	waitFor(t, "R's claim to give up", func() bool {
		for _, e := range logs.FilterMessage("request refused").All() {
			if e.ContextMap()["run_id"] == r {
				return true
			}
		}
		return false
	})
	sc.lossy.Restore()
	sc.rYieldsToC(t, "R, superseded while its claim retried", c)
}

// TestSessionMessageWhoseClaimRetryFindsANewerOneYieldsToIt: as above, but R's retry runs
// before the cancel of the newer message C reaches R (here C's gateway publishes where R's
// does not listen). The retry found C current and took the session back from it: R ran, C was
// told to stop, and A, which R's committed attempt had replaced, ran on to its end — the older
// message won over the newer one. R, the older message, is now answered 409 superseded, not to
// be retried, the session stays on C, and A is stopped.
func TestSessionMessageWhoseClaimRetryFindsANewerOneYieldsToIt(t *testing.T) {
	sc := newClaimLostScene(t, nil, func(h *harness) runstate.Keys { return runstate.Keys{Prefix: h.keys.Prefix + "other:"} })
	c := sendOK(t, "C", sc.other, sc.key, `{"model":"fake-gpt","messages":[{"role":"user","content":"C: a third question"}]}`, sc.session)
	sc.lossy.Restore()
	sc.rYieldsToC(t, "R, whose claim's retry found the newer C", c)
}

// claimLostScene is a session ("s") whose long stream A runs on the first gateway (h), and R,
// the session's next message there, whose claim took the session from A and committed with
// its COMMIT reply lost: the network to the database stays down, and R's claim backs off and
// retries, until lossy.Restore. other is a second gateway that reaches the database (plain).
type claimLostScene struct {
	h       *harness
	userID  uint64
	key     string
	session map[string]string
	plain   *sqlx.DB
	lossy   *testenv.Lossy
	other   string
	aRun    string
	a       *bufio.Reader // A's stream, past its first line
	r       chan answer   // R's answer
	leaveR  context.CancelFunc
}

// aChunks is the length of A's stream, 5 ms a chunk: long enough to outlast an admission
// budget (5 s) with room to spare, so that only a cancel ends it early.
const aChunks = 4000

// newClaimLostScene sets the scene; log is the first gateway's (nil: the harness's own),
// otherKeys the Redis keys the second gateway names.
func newClaimLostScene(t *testing.T, log *zap.Logger, otherKeys func(*harness) runstate.Keys) *claimLostScene {
	t.Helper()
	dsn, lossy := testenv.LossyMySQLDSN(t)
	db := testenv.Open(t, dsn)
	// The session check is off: it stops a replaced run its cancel never reached, and would
	// hide a claim that failed to cancel what it replaced (its own tests: session_check_test.go).
	h := newHarnessOn(t, harnessSetup{db: db, log: log, sessionCheckInterval: -1}, nil)
	u, key := h.user("standard")
	sc := &claimLostScene{h: h, userID: u.ID, key: key, session: map[string]string{proxy.SessionHeader: "s"},
		plain: plainHandle(t, dsn), lossy: lossy, r: make(chan answer, 1)}
	rCtx, leaveR := context.WithCancel(context.Background())
	sc.leaveR = leaveR
	t.Cleanup(leaveR)
	sc.other = gatewayOn(h, sc.plain, otherKeys(h))

	a := h.post(key, "/v1/chat/completions",
		`{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"tell me a long story"}]}`,
		map[string]string{proxy.SessionHeader: "s", fakellm.HeaderChunks: strconv.Itoa(aChunks), fakellm.HeaderChunkInterval: "5ms"})
	t.Cleanup(func() { a.Body.Close() })
	sc.aRun = a.Header.Get(proxy.RunIDHeader)
	sc.a = bufio.NewReader(a.Body)
	if _, err := sc.a.ReadString('\n'); err != nil {
		t.Fatal(err)
	}

	// R's claim waits on the session row; once it runs, its COMMIT lands and the network to
	// the database goes down with its reply, so R's claim backs off and retries until Restore.
	lock := testenv.ConsoleTx(t, sc.plain)
	var sid string
	if err := lock.Get(&sid, "SELECT session_id FROM sessions WHERE user_id = ? FOR UPDATE", u.ID); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc.r <- sendToCtx(rCtx, h.gw.URL, "/v1/chat/completions", key,
			`{"model":"fake-gpt","messages":[{"role":"user","content":"R: another question"}]}`, sc.session)
	}()
	waitForStatement(t, sc.plain, "INSERT INTO sessions")
	lossy.Arm("COMMIT", testenv.GoDown)
	t.Cleanup(lossy.Restore)
	if err := lock.Commit(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "R's claim committing", lossy.Down)
	return sc
}

// rYieldsToC checks the scene's end once the newer message C (its answer c) has run: R is
// answered 409 superseded, not to be retried; A, which R's committed claim replaced, ends as
// superseded, settled by cancel at its partial output; the session stays on C.
func (sc *claimLostScene) rYieldsToC(t *testing.T, what string, c answer) {
	t.Helper()
	got := <-sc.r
	if got.status != http.StatusConflict || errorCode(t, got.body) != "superseded" || got.header.Get("X-Should-Retry") != "false" {
		t.Fatalf("%s: %d %s (X-Should-Retry %q); want 409 superseded, X-Should-Retry: false",
			what, got.status, got.body, got.header.Get("X-Should-Retry"))
	}
	sc.aStopped(t, "A, replaced by R's committed claim")
	var current string
	if err := sc.plain.Get(&current, "SELECT current_run_id FROM sessions WHERE user_id = ?", sc.userID); err != nil || current != c.header.Get(proxy.RunIDHeader) {
		t.Fatalf("session is on %q (%v), want C's run %s", current, err, c.header.Get(proxy.RunIDHeader))
	}
}

// TestSessionClaimGivenUpWithItsCommitUnansweredStopsTheRunItReplaced: a session's message R
// whose claim took the session from a running message A and committed with its COMMIT reply
// lost is refused when its claim gives up — billing down once the admission budget is spent,
// or the caller gone — with no newer message in between. Nothing told A to stop: R's claim
// answered nothing, and A ran to its end, charged in full for a conversation its caller had
// moved on from. A is now stopped once the database answers again, as the run a committed
// claim replaced always is.
func TestSessionClaimGivenUpWithItsCommitUnansweredStopsTheRunItReplaced(t *testing.T) {
	for _, tc := range []struct {
		name  string
		giveR func(t *testing.T, sc *claimLostScene, logs *observer.ObservedLogs)
	}{
		{"billing down", func(t *testing.T, sc *claimLostScene, _ *observer.ObservedLogs) {
			if got := <-sc.r; got.status != http.StatusServiceUnavailable {
				t.Fatalf("R, its claim's COMMIT unanswered for the whole admission budget: %d %s, want 503", got.status, got.body)
			}
		}},
		{"caller left", func(t *testing.T, sc *claimLostScene, logs *observer.ObservedLogs) {
			var r string
			if err := sc.plain.Get(&r, "SELECT current_run_id FROM sessions WHERE user_id = ?", sc.userID); err != nil {
				t.Fatal(err)
			}
			sc.leaveR()
			waitFor(t, "R's claim to give up", func() bool {
				for _, e := range logs.FilterMessage("request refused").All() {
					if e.ContextMap()["run_id"] == r {
						return true
					}
				}
				return false
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.InfoLevel)
			sc := newClaimLostScene(t, zap.New(core), func(h *harness) runstate.Keys { return h.keys })
			tc.giveR(t, sc, logs)
			sc.lossy.Restore()
			sc.aStopped(t, "A, replaced by the committed attempt of R's failed claim")
		})
	}
}

// aStopped checks that A, the scene's long stream, ended as superseded before its end, and was
// settled by cancel at its partial output.
func (sc *claimLostScene) aStopped(t *testing.T, what string) {
	t.Helper()
	rest, err := io.ReadAll(sc.a)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rest), `"code":"superseded"`) || strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("%s did not end as superseded: ...%s", what, rest[max(0, len(rest)-300):])
	}
	sc.h.settled()
	if run := sc.h.run(sc.userID, sc.aRun); run.SettleSource.String != holds.SourceCancel || run.OutTok >= aChunks {
		t.Fatalf("%s = %+v, want settled by cancel with its partial output", what, run)
	}
}

// plainHandle is a handle on dsn's database around its lossy network, opened as the gateway
// opens its own.
func plainHandle(t *testing.T, dsn string) *sqlx.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Net = "tcp"
	db, err := holds.Open(context.Background(), cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// gatewayOn is another gateway on h's Redis under keys and on db, a handle on h's database of
// its own (one that reaches it while h's does not), and returns its URL.
func gatewayOn(h *harness, db *sqlx.DB, keys runstate.Keys) string {
	h.t.Helper()
	log := zaptest.NewLogger(h.t, zaptest.Level(zap.WarnLevel))
	store := holds.NewStore(db, plans.FromConfig(h.cfg), "standard", log)
	leases := runstate.NewLeases(h.rdb, keys, "test-2", h.cfg.Holds.LeaseTTL, h.cfg.Holds.HeartbeatInterval, log)
	tally := runstate.NewTally(h.rdb, keys, h.cfg.Holds.TallyTTL)
	srv := proxy.New(proxy.Deps{Config: h.cfg, Store: store, Redis: h.rdb, Keys: keys, Tally: tally, Leases: leases, Log: log})
	gw := httptest.NewServer(srv.Handler())
	h.t.Cleanup(func() {
		gw.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.WaitSettlements(ctx); err != nil {
			h.t.Errorf("second gateway settlements: %v", err)
		}
		_ = srv.Close()
	})
	return gw.URL
}
