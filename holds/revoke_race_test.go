package holds_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestRevokeKeyOfNoLiveKeyIsErrKeyNotFound: RevokeKey of a key that is not live (never issued,
// or already revoked) answered an error of its own ("no live key with that value") that was
// not ErrKeyNotFound, so errors.Is could not tell it from a database failure.
func TestRevokeKeyOfNoLiveKeyIsErrKeyNotFound(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("rita", "standard")
	key, err := f.store.CreateKey(f.ctx(), u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.store.RevokeKey(f.ctx(), key); err != nil {
		t.Fatalf("revoke a live key: %v", err)
	}
	if err := f.store.RevokeKey(f.ctx(), key); !errors.Is(err, holds.ErrKeyNotFound) {
		t.Fatalf("revoke it again: %v; want ErrKeyNotFound", err)
	}
	if err := f.store.RevokeKey(f.ctx(), holds.KeyPrefix+"never-issued"); !errors.Is(err, holds.ErrKeyNotFound) {
		t.Fatalf("revoke a key never issued: %v; want ErrKeyNotFound", err)
	}
}

// TestRevokeAPIKeyRacedBetweenItsStatements: RevokeAPIKey reads whose live key it is, then
// revokes it. Between the two, another revocation may kill the key (it is dead either way:
// answered as revoked), or its row may go (deleted by hand): then no live key matches, and the
// answer must be ErrKeyNotFound, the admin API's 404 key_not_found. It was RevokeKey's own
// error, which the admin API answered 500 internal_error.
func TestRevokeAPIKeyRacedBetweenItsStatements(t *testing.T) {
	for _, tc := range []struct {
		name    string
		between string // what another client does while the revocation's UPDATE is held
		wantErr error
	}{
		{"revoked concurrently", "UPDATE api_keys SET revoked_at = NOW(6) WHERE key_hash = ?", nil},
		{"row deleted", "DELETE FROM api_keys WHERE key_hash = ?", holds.ErrKeyNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hold := testenv.NewHeldWrite("UPDATE api_keys SET revoked_at")
			held, plain := holdingDSN(t, hold)
			db := testenv.Open(t, held)
			// A test that stops early still lets the held write go, so nothing waits on it.
			let := sync.OnceFunc(hold.Let)
			t.Cleanup(let)
			st := holds.NewStore(db, acctPlans(), "standard", zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			u, err := st.CreateUser(ctx, "racer", "standard")
			if err != nil {
				t.Fatal(err)
			}
			key, err := st.CreateKey(ctx, u.ID)
			if err != nil {
				t.Fatal(err)
			}
			type answer struct {
				owner string
				err   error
			}
			done := make(chan answer, 1)
			go func() {
				owner, err := st.RevokeAPIKey(ctx, key)
				done <- answer{owner, err}
			}()
			select {
			case <-hold.Held():
			case a := <-done:
				t.Fatalf("revocation answered %q, %v without its UPDATE being held", a.owner, a.err)
			case <-ctx.Done():
				t.Fatal("the revocation's UPDATE was never sent")
			}
			hash := holds.HashKey(key)
			// A connection of its own, around the held one.
			other := testenv.Open(t, plain)
			if _, err := other.ExecContext(ctx, tc.between, hash[:]); err != nil {
				t.Fatal(err)
			}
			let()
			a := <-done
			if tc.wantErr == nil && (a.err != nil || a.owner != "racer") {
				t.Fatalf("revoke raced by %s: %q, %v; want racer's key answered revoked", tc.name, a.owner, a.err)
			}
			if tc.wantErr != nil && !errors.Is(a.err, tc.wantErr) {
				t.Fatalf("revoke raced by %s: %q, %v; want %v", tc.name, a.owner, a.err, tc.wantErr)
			}
		})
	}
}

// holdingDSN makes a fresh test database and returns its DSN on connections whose writes pass
// through hold, and its plain DSN.
func holdingDSN(t *testing.T, hold *testenv.HeldWrite) (held, plain string) {
	t.Helper()
	plain = testenv.MySQLDSN(t)
	cfg, err := mysql.ParseDSN(plain)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Net = "tg-hold-" + testenv.RandomID(6)
	addr := cfg.Addr
	mysql.RegisterDialContext(cfg.Net, func(ctx context.Context, _ string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return &testenv.HoldingConn{Conn: c, Hold: hold}, nil
	})
	return cfg.FormatDSN(), plain
}
