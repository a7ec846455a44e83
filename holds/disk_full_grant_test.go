package holds_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestGrantRefusedByAFullDiskThenItsCommitReplyLostCreditsOnce: a grant (a new row in grants)
// refused 1114 on a full disk is tried again within its deadline (withRoomRetry), with the
// attempt token it was given once, before its first try. Once there is room, its next try
// commits but the COMMIT's reply is lost with the connection; the try after that finds the
// grant by its key, carrying the call's token: the call answers created, the grant's row is
// there once, and the user's prepaid credits grew by its amount once. A token drawn per try
// would answer "replayed" for the call's own grant; a retry that did not look the key up first
// would credit it twice.
func TestGrantRefusedByAFullDiskThenItsCommitReplyLostCreditsOnce(t *testing.T) {
	dir := testenv.SmallFileSystem(t, "1m")
	dsn, lossy := testenv.LossyMySQLDSN(t)
	db := testenv.Open(t, dsn)
	testenv.TableOn(t, db, "grants", dir)
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	core, logs := observer.New(zapcore.WarnLevel)
	st := holds.NewStore(db, settlePlans, "standard", zap.New(core))
	st.SetRetry(holds.RetryPolicy{MaxConflictRetries: 8, InitialBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	ctx := context.Background()
	filling, err := st.CreateUser(ctx, "fill-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	u, err := st.CreateUser(ctx, "grantee-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(dir, "filler")
	// Room is given back before the database's cleanup drops the table (newFullDiskFixture).
	t.Cleanup(func() { _ = os.Remove(filler) })
	testenv.Fill(t, filler)

	// Grants of another user until one is refused for want of room: grants' pages are full. A
	// refused grant waits for room until its context ends (withRoomRetry): each is ended once its
	// refusal is logged, not by a short deadline, which a grant slow on a busy machine (no
	// refusal, only slow) ran past and failed the test with its deadline exceeded. The minute
	// is a watchdog.
	reason := strings.Repeat("r", 255)
	full := false
	for i := 0; i < 5000 && !full; i++ {
		gctx, cancel := context.WithTimeout(ctx, time.Minute)
		granted := make(chan error, 1)
		go func() {
			_, _, err := st.Grant(gctx, holds.GrantRequest{UserID: filling.ID, AmountMicro: 1, IdempotencyKey: fmt.Sprintf("fill-%05d", i), Reason: reason})
			granted <- err
		}()
		refusals := logs.Filter(refusedFull).Len()
		var err error
	fill:
		for {
			select {
			case err = <-granted:
				break fill
			case <-time.After(time.Millisecond):
				if logs.Filter(refusedFull).Len() > refusals {
					cancel()
				}
			}
		}
		cancel()
		full = holds.IsOutOfRoom(err)
		if err != nil && !full {
			t.Fatal(err)
		}
	}
	if !full {
		t.Fatal("no grant refused on a full disk: the test proves nothing")
	}
	before, err := st.Balance(ctx, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	seenBefore := logs.Filter(refusedFull).Len()

	lossy.Arm("COMMIT", testenv.LoseReply)
	req := holds.GrantRequest{UserID: u.ID, AmountMicro: 7_000, IdempotencyKey: "evt_full_lost_" + testenv.RandomID(4), Reason: "top-up"}
	type outcome struct {
		g       holds.Grant
		created bool
		err     error
	}
	out := make(chan outcome, 1)
	go func() {
		gctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		g, created, err := st.Grant(gctx, req)
		out <- outcome{g, created, err}
	}()
	// Room is made once its refusal is logged; an answer before that is the test's failure.
	var o outcome
	seen := false
wait:
	for {
		select {
		case o = <-out:
			break wait
		case <-time.After(time.Millisecond):
			if !seen && logs.Filter(refusedFull).Len() > seenBefore {
				seen = true
				if err := os.Remove(filler); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if !seen {
		t.Fatalf("grant answered %+v, %v before any refusal for a full table: the test proves nothing", o.g, o.err)
	}
	if !lossy.Fired() {
		t.Fatal("the grant's commit reply was never lost")
	}
	if o.err != nil || !o.created || o.g.AmountMicro != req.AmountMicro {
		t.Fatalf("grant refused by a full disk, then its commit reply lost: %+v created=%v, %v; want created", o.g, o.created, o.err)
	}
	var rows int
	if err := db.Get(&rows, "SELECT COUNT(*) FROM grants WHERE idempotency_key = ?", req.IdempotencyKey); err != nil || rows != 1 {
		t.Fatalf("%d grant rows for the key (%v); want 1", rows, err)
	}
	after, err := st.Balance(ctx, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d := after.PrepaidMicro - before.PrepaidMicro; d != req.AmountMicro {
		t.Fatalf("prepaid grew by %d micro-USD; want %d, once", d, req.AmountMicro)
	}
}
