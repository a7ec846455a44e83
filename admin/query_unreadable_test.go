package admin_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestUnreadableQueryFilterIsRefusedNotDropped: a query pair Go cannot read (a bad percent
// escape, a semicolon) is dropped without an error by URL.Query, so the user filter of
// ?user=ann%zz or ?user=ann;state=settled vanished and one user's report or listing answered
// 200 with every user's rows, the very case unknown_parameter refuses for a misspelt filter.
// Such a query must be refused with 400 in the OpenAI error shape.
func TestUnreadableQueryFilterIsRefusedNotDropped(t *testing.T) {
	f := newFixture(t, adminToken)
	for i, name := range []string{"ann", "bob"} {
		f.admin("POST", "/admin/users", map[string]any{"name": name}, http.StatusCreated)
		u, err := f.store.UserByName(f.ctx(), name)
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("r_q_%d", i)
		if _, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: id, UserID: u.ID, Model: "gpt-a", State: holds.StateRunning, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: id, CostMicro: 1_000, Calls: 1, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
	for _, path := range []string{
		"/admin/reports/usage?user=ann%zz",
		"/admin/reports/usage?user=ann;format=json",
		"/admin/runs?user=ann%",
		"/admin/runs?user=ann;state=settled",
		"/admin/users?after=%zz",
	} {
		status, out, raw := f.call("GET", path, adminToken, nil)
		if status != http.StatusBadRequest || errCode(out) != "invalid_request" {
			t.Errorf("GET %s: %d %s; want 400 invalid_request, not the filter dropped", path, status, raw)
		}
	}
}
