package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/plans"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestReadyzSaysWhenTheDatabaseRefusesWrites: a MariaDB that answers reads and refuses writes
// (read_only set on a demoted primary after a failover, or for maintenance) answers PING, so
// /readyz said ready while every call was refused 503 billing_unavailable for the hold it
// could not write: the load balancer kept sending calls to a gateway that could serve none.
// The session here is read-only (tx_read_only), which refuses writes as read_only does for
// a user without READ ONLY ADMIN, without touching the shared server's global setting.
func TestReadyzSaysWhenTheDatabaseRefusesWrites(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Params = map[string]string{"tx_read_only": "1"}
	h := newHarnessOn(t, harnessSetup{db: testenv.Open(t, cfg.FormatDSN())}, nil)

	// The caller's account, written where writes are taken.
	rw := holds.NewStore(testenv.Open(t, dsn), plans.FromConfig(h.cfg), "standard", zap.NewNop())
	u, err := rw.CreateUser(context.Background(), "u"+testenv.RandomID(4), "standard")
	if err != nil {
		t.Fatal(err)
	}
	key, err := rw.CreateKey(context.Background(), u.ID)
	if err != nil {
		t.Fatal(err)
	}
	h.postRefused(t, key, "/v1/chat/completions", `{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}]}`, nil,
		http.StatusServiceUnavailable, "billing_unavailable")

	resp, err := http.Get(h.gw.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"mysql":"unavailable"`) ||
		!strings.Contains(string(body), `"redis":"ok"`) {
		t.Fatalf("/readyz with the database refusing writes: %d %s, want 503 naming mysql alone", resp.StatusCode, body)
	}
}
