package runstate_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
)

// lossModes are the ways a write to Redis can go wrong on the wire: its reply lost once
// (go-redis sends it again), its reply lost on every attempt (it ran; the caller sees an
// error), and its request lost on every attempt (it never ran).
var lossModes = []struct {
	name  string
	loss  testenv.RedisLoss
	every bool
}{
	{"reply lost once", testenv.RedisReplyLost, false},
	{"reply lost every attempt", testenv.RedisReplyLost, true},
	{"request lost every attempt", testenv.RedisRequestLost, true},
}

// TestRunStateWritesWhoseRepliesOrRequestsWereLost: every write of a named run's state in
// Redis that is not a call's reservation or tally (those are tested through the gateway),
// with its reply or its request lost. A resend must find what the first run did and answer as
// it would have; a write whose every reply was lost has landed whatever its caller thinks, and
// one whose request was lost has not — either way the error must not be taken for an answer:
// a reservation whose beat failed is not reported dropped, a run whose loss mark was written
// keeps waiting from that mark, a lease not deleted keeps only its TTL.
func TestRunStateWritesWhoseRepliesOrRequestsWereLost(t *testing.T) {
	type env struct {
		budget *runstate.RunBudget
		leases *runstate.Leases
		keys   runstate.Keys
		plain  *redis.Client // not lossy: the test's own reads and writes
	}
	for _, w := range []struct {
		name   string
		marker func(e env, run string) string
		// setup prepares run (and warms the write's script on another run, so that it goes
		// as EVALSHA and runs).
		setup func(t *testing.T, e env, run string)
		write func(e env, run string) error
		// check looks at the write's error and at Redis after it; landed says whether the
		// write ran.
		check func(t *testing.T, e env, run string, err error, landed, failed bool)
	}{
		{
			name:   "reopen",
			marker: func(e env, run string) string { return e.keys.RunBudget(run) },
			setup: func(t *testing.T, e env, run string) {
				mustClose(t, e.budget, "r_warm_reopen")
				if err := e.budget.ReopenRun(context.Background(), "r_warm_reopen", "none"); err != nil {
					t.Fatal(err)
				}
				mark := mustClose(t, e.budget, run)
				e.plain.Set(context.Background(), run+":mark", mark, time.Minute)
			},
			write: func(e env, run string) error {
				return e.budget.ReopenRun(context.Background(), run, e.plain.Get(context.Background(), run+":mark").Val())
			},
			check: func(t *testing.T, e env, run string, err error, landed, failed bool) {
				closed := e.plain.HExists(context.Background(), e.keys.RunBudget(run), "closed").Val()
				if closed == landed {
					t.Fatalf("run closed %v after a reopen that ran %v (error %v)", closed, landed, err)
				}
				if closed {
					// Not reopened: closed only until the mark lapses, the longest call.
					if ttl := e.plain.PTTL(context.Background(), e.keys.RunBudget(run)).Val(); ttl <= 0 || ttl > time.Hour {
						t.Fatalf("run left closed for %v, want at most the longest call", ttl)
					}
				}
			},
		},
		{
			name:   "close",
			marker: func(e env, run string) string { return e.keys.RunBudget(run) },
			setup: func(t *testing.T, e env, run string) {
				mustClose(t, e.budget, "r_warm_close")
			},
			write: func(e env, run string) error {
				mark, err := e.budget.CloseRun(context.Background(), run)
				e.plain.Set(context.Background(), run+":mark", mark, time.Minute)
				return err
			},
			check: func(t *testing.T, e env, run string, err error, landed, failed bool) {
				ctx := context.Background()
				mark := e.plain.Get(ctx, run+":mark").Val()
				if !failed && err != nil {
					// A resend found its own close: the run is closed by it, and not busy.
					t.Fatalf("close resent after its reply was lost: %v, want the run closed", err)
				}
				if mark == "" {
					t.Fatalf("close answered %v without its mark: a close that landed could not be reopened", err)
				}
				closed := e.plain.HGet(ctx, e.keys.RunBudget(run), "closed").Val()
				if (closed == mark) != landed {
					t.Fatalf("run closed by %q after a close with mark %q that ran %v (error %v)", closed, mark, landed, err)
				}
				// The settlement that gave up reopens the run with the mark it was given.
				if err := e.budget.ReopenRun(ctx, run, mark); err != nil {
					t.Fatal(err)
				}
				if e.plain.HExists(ctx, e.keys.RunBudget(run), "closed").Val() {
					t.Fatal("run still closed after its settlement reopened it")
				}
			},
		},
		{
			name:   "await rebuild",
			marker: func(e env, run string) string { return e.keys.Lost(run) },
			setup: func(t *testing.T, e env, run string) {
				_ = e.budget.AwaitRebuild(context.Background(), "r_warm_rebuild")
			},
			write: func(e env, run string) error { return e.budget.AwaitRebuild(context.Background(), run) },
			check: func(t *testing.T, e env, run string, err error, landed, failed bool) {
				if !failed && !errors.Is(err, runstate.ErrRunBusy) {
					t.Fatalf("first notice of a loss, resent: %v, want ErrRunBusy", err)
				}
				marked := e.plain.Exists(context.Background(), e.keys.Lost(run)).Val() == 1
				if marked != landed {
					t.Fatalf("loss marked %v after a notice that ran %v", marked, landed)
				}
				// The next settle waits from the first mark, whatever the first notice answered.
				if err := e.budget.AwaitRebuild(context.Background(), run); !errors.Is(err, runstate.ErrRunBusy) {
					t.Fatalf("notice after the first: %v, want ErrRunBusy", err)
				}
			},
		},
		{
			name:   "recorded",
			marker: func(e env, run string) string { return e.keys.RunBudget(run) },
			setup: func(t *testing.T, e env, run string) {
				_ = e.budget.Recorded(context.Background(), "r_warm_recorded", "a")
				e.plain.HSet(context.Background(), e.keys.RunBudget(run), "r:a", time.Now().UnixMilli())
			},
			write: func(e env, run string) error { return e.budget.Recorded(context.Background(), run, "a") },
			check: func(t *testing.T, e env, run string, err error, landed, failed bool) {
				if marked := e.plain.HExists(context.Background(), e.keys.RunBudget(run), "r:a").Val(); marked == landed {
					t.Fatalf("record mark standing %v after a drop that ran %v", marked, landed)
				}
			},
		},
		{
			name:   "reservation beat",
			marker: func(e env, run string) string { return e.keys.RunBudget(run) },
			setup: func(t *testing.T, e env, run string) {
				if _, err := e.budget.Reserve(context.Background(), run, "a", 1000, 100, 10); err != nil {
					t.Fatal(err)
				}
				// Beaten last at 1: a beat that lands restamps it.
				e.plain.HSet(context.Background(), e.keys.RunBudget(run), "c:a", "100:1")
			},
			write: func(e env, run string) error {
				lost, err := e.budget.Refresh(context.Background())
				if len(lost) != 0 {
					return errReportedDropped
				}
				return err
			},
			check: func(t *testing.T, e env, run string, err error, landed, failed bool) {
				if errors.Is(err, errReportedDropped) {
					t.Fatal(err)
				}
				beaten := e.plain.HGet(context.Background(), e.keys.RunBudget(run), "c:a").Val() != "100:1"
				if beaten != landed {
					t.Fatalf("reservation beaten %v after a beat that ran %v (error %v)", beaten, landed, err)
				}
			},
		},
		{
			name:   "lease delete",
			marker: func(e env, run string) string { return e.keys.Lease(run) },
			setup: func(t *testing.T, e env, run string) {
				ctx := context.Background()
				e.leases.Acquire("r_warm_lease")
				e.leases.Acquire(run)
				if err := e.leases.Refresh(ctx); err != nil {
					t.Fatal(err)
				}
				if err := e.leases.Release(ctx, "r_warm_lease"); err != nil {
					t.Fatal(err)
				}
			},
			write: func(e env, run string) error { return e.leases.Release(context.Background(), run) },
			check: func(t *testing.T, e env, run string, err error, landed, failed bool) {
				ttl := e.plain.PTTL(context.Background(), e.keys.Lease(run)).Val()
				if leased := ttl > 0; leased == landed {
					t.Fatalf("lease standing %v after a delete that ran %v", leased, landed)
				} else if leased && ttl > time.Minute {
					t.Fatalf("lease not deleted lives %v, want at most its TTL", ttl)
				}
				if e.leases.Held() != 0 {
					t.Fatal("lease still held here after its release")
				}
			},
		},
	} {
		for _, m := range lossModes {
			t.Run(w.name+"/"+m.name, func(t *testing.T) {
				plain, prefix := testenv.Redis(t)
				opt, lossy := testenv.LossyRedisOptions(t)
				rdb := redis.NewClient(opt)
				t.Cleanup(func() { rdb.Close() })
				keys := runstate.Keys{Prefix: prefix}
				e := env{
					budget: runstate.NewRunBudget(rdb, keys, time.Hour, time.Hour, testStaleAfter),
					leases: runstate.NewLeases(rdb, keys, "process-a", time.Minute, time.Second, zap.NewNop()),
					keys:   keys, plain: plain,
				}
				const run = "r_lost"
				w.setup(t, e, run)
				times := 1
				if m.every {
					times = rdb.Options().MaxRetries + 1
				}
				lossy.Arm(w.marker(e, run), m.loss, times)
				err := w.write(e, run)
				lossy.Disarm()
				if lossy.Fired() != times {
					t.Fatalf("%d writes lost, want %d", lossy.Fired(), times)
				}
				if failed := err != nil && !errors.Is(err, runstate.ErrRunBusy); failed != m.every {
					t.Fatalf("write with %s: %v", m.name, err)
				}
				w.check(t, e, run, err, m.loss == testenv.RedisReplyLost || !m.every, m.every)
			})
		}
	}
}

// errReportedDropped: a beat reported a reservation still in Redis as dropped.
var errReportedDropped = errors.New("a reservation still there reported dropped")

// mustClose closes run for settlement and returns the close's mark.
func mustClose(t *testing.T, b *runstate.RunBudget, run string) string {
	t.Helper()
	mark, err := b.CloseRun(context.Background(), run)
	if err != nil {
		t.Fatal(err)
	}
	return mark
}
