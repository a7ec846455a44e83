package holds_test

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestSessionClaimWhateverTheDSNSaysOfFoundRows: a session's claim tells a new session from a
// known one by the rows its upsert changed (1 inserted, 0 for the no-op update that locks an
// existing row). With the driver's clientFoundRows=true in mysql_dsn (which applications
// sharing a DSN often set) the no-op update counted 1 too: every claim read as a new session,
// so the same message sent twice while its run was live was not a duplicate (both calls ran
// and were charged), a different message did not replace the live run (it was never
// cancelled), and the session's row kept pointing at its first run. Open owns the setting, as
// it owns the others the money code relies on.
func TestSessionClaimWhateverTheDSNSaysOfFoundRows(t *testing.T) {
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ClientFoundRows = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := holds.Open(ctx, cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	st := holds.NewStore(db, settlePlans, "standard", zap.NewNop())
	u, err := st.CreateUser(ctx, "found-rows-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range []string{"r_fr1", "r_fr2", "r_fr3"} {
		if _, err := st.Admit(ctx, holds.AdmitRequest{RunID: run, UserID: u.ID, SessionID: "s1", Model: "m",
			State: holds.StateRunning, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(run, msg string) holds.SessionClaim {
		t.Helper()
		c, err := st.ClaimSession(ctx, u.ID, "s1", run, sha256.Sum256([]byte(msg)))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if c := claim("r_fr1", "hello"); c.Duplicate || c.Current != "r_fr1" {
		t.Fatalf("new session: %+v", c)
	}
	if c := claim("r_fr2", "hello"); !c.Duplicate || c.Current != "r_fr1" {
		t.Errorf("same message while r_fr1 runs: %+v, want a duplicate of r_fr1", c)
	}
	if c := claim("r_fr3", "something else"); c.Duplicate || c.Replaced != "r_fr1" || c.Current != "r_fr3" {
		t.Errorf("different message while r_fr1 runs: %+v, want r_fr1 replaced by r_fr3", c)
	}
	for _, run := range []string{"r_fr1", "r_fr2", "r_fr3"} {
		if _, err := st.Settle(ctx, holds.Settlement{RunID: run, Source: holds.SourceRelease}); err != nil {
			t.Fatal(err)
		}
	}
}
