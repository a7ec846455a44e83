package admin_test

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
)

// TestAdminListsGatewayProcesses: GET /admin/instances pages the gateway processes' rows,
// newest start first, each with its state — alive, silent (its beat older than its bound, not
// yet declared), dead (declared by a reconciler), retired (its own shutdown) — and the time it
// was declared dead once it was; an after that names no row is 400 invalid_after.
func TestAdminListsGatewayProcesses(t *testing.T) {
	f := newFixture(t, adminToken)
	register := func(name string) *holds.Instance {
		in, err := f.store.RegisterInstance(f.ctx(), name, time.Second, time.Hour, zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	register("alive")
	retired, dead, silent := register("retired"), register("dead"), register("silent")
	if err := retired.Retire(f.ctx()); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.ExecContext(f.ctx(), "UPDATE instances SET dead_at = NOW(6) WHERE id = ?", dead.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.ExecContext(f.ctx(), "UPDATE instances SET beat_at = beat_at - INTERVAL 2 HOUR WHERE id = ?", silent.ID()); err != nil {
		t.Fatal(err)
	}

	var names, states []string
	after := ""
	for page := 0; ; page++ {
		status, body, raw := f.call("GET", "/admin/instances?limit=3"+after, adminToken, nil)
		if status != http.StatusOK || page > 2 {
			t.Fatalf("page %d: %d %s", page, status, raw)
		}
		for _, row := range body["data"].([]any) {
			r := row.(map[string]any)
			names, states = append(names, r["name"].(string)), append(states, r["state"].(string))
			if _, ok := r["dead_at"]; ok != (r["state"] == holds.InstanceDead || r["state"] == holds.InstanceRetired) {
				t.Errorf("%s (%s): dead_at present %v", r["name"], r["state"], ok)
			}
		}
		if body["has_more"] != true {
			break
		}
		after = "&after=" + body["last_id"].(string)
	}
	if want := []string{"silent", "dead", "retired", "alive"}; !slices.Equal(names, want) {
		t.Errorf("listed %v, want newest start first %v", names, want)
	}
	if want := []string{holds.InstanceSilent, holds.InstanceDead, holds.InstanceRetired, holds.InstanceAlive}; !slices.Equal(states, want) {
		t.Errorf("states %v, want %v", states, want)
	}
	if status, body, raw := f.call("GET", "/admin/instances?after=0123456789abcdef0123456789abcdef", adminToken, nil); status != http.StatusBadRequest ||
		body["error"].(map[string]any)["code"] != "invalid_after" {
		t.Errorf("unknown after: %d %s, want 400 invalid_after", status, raw)
	}
}
