package admin_test

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// runsPage is one page of GET /admin/runs: the run ids listed, has_more and last_id.
func (f *fixture) runsPage(t *testing.T, path string) (ids []string, more bool, last string) {
	t.Helper()
	out := f.admin("GET", path, nil, http.StatusOK)
	data, _ := out["data"].([]any)
	for _, row := range data {
		ids = append(ids, row.(map[string]any)["id"].(string))
	}
	more, _ = out["has_more"].(bool)
	last, _ = out["last_id"].(string)
	return ids, more, last
}

// TestRunsListingPagesPastAPrunedRun: the next page of GET /admin/runs looked up the run its
// cursor named to find where the page before ended; a run `gateway prune` deleted between two
// pages was no run, and the next page answered 400 invalid_after, so an export paging through
// old runs while a prune ran broke mid-way. last_id now carries the position itself (the sort
// key and the run id): the page after a pruned run lists the rest, none twice and none
// skipped, and a run admitted meanwhile (newer than the cursor) is not listed there. A plain
// run id, what scripts sent before, still pages while its run exists; a cursor that is
// neither is 400 invalid_after saying why.
func TestRunsListingPagesPastAPrunedRun(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "exporter"}, http.StatusCreated)
	u, err := f.store.UserByName(f.ctx(), "exporter")
	if err != nil {
		t.Fatal(err)
	}
	// Seven runs begun 30 days ago, a minute apart. r_4 settled then and is prunable; the
	// others settled within the hour (named runs settled late), so a prune keeps them. Each is
	// a release at 0, which the day ledger does not count, so moving settled_at keeps the books.
	for i := range 7 {
		id := fmt.Sprintf("r_%d", i)
		if _, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: id, UserID: u.ID, Model: "m", State: holds.StateRunning, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: id, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.db.ExecContext(f.ctx(), `UPDATE run_holds SET created_at = NOW(6) - INTERVAL 30 DAY + INTERVAL ? MINUTE,
			settled_at = IF(run_id = 'r_4', NOW(6) - INTERVAL 30 DAY + INTERVAL ? MINUTE + INTERVAL 1 SECOND, NOW(6) - INTERVAL 1 HOUR + INTERVAL ? SECOND)
			WHERE run_id = ?`, i, i, i, id); err != nil {
			t.Fatal(err)
		}
	}
	const base = "/admin/runs?user=exporter&limit=3"
	got, more, cursor := f.runsPage(t, base)
	if want := []string{"r_6", "r_5", "r_4"}; !slices.Equal(got, want) || !more {
		t.Fatalf("first page %v (has_more %v), want %v and more", got, more, want)
	}
	if res, err := f.store.PruneSettled(f.ctx(), holds.MinPruneAge, 100); err != nil || res.Runs != 1 {
		t.Fatalf("prune: %+v, %v; want r_4 alone pruned", res, err)
	}
	f.admitInOneBatch([]holds.AdmitRequest{{RunID: "r_new", UserID: u.ID, Model: "m", State: holds.StateQueued, TTL: time.Minute}})
	for page := 0; more; page++ {
		if page > 5 {
			t.Fatal("the listing never ends")
		}
		var ids []string
		ids, more, cursor = f.runsPage(t, base+"&after="+url.QueryEscape(cursor))
		got = append(got, ids...)
	}
	if want := []string{"r_6", "r_5", "r_4", "r_3", "r_2", "r_1", "r_0"}; !slices.Equal(got, want) {
		t.Fatalf("paged across a prune: %v, want each of %v once, in order", got, want)
	}

	// By settlement, newest first, the cursor is the settlement's: every walk lists the rest.
	f.checkWalks(t, "/admin/runs?user=exporter&settled_since="+url.QueryEscape(time.Now().UTC().Add(-40*24*time.Hour).Format(time.RFC3339)),
		"id", []string{"r_6", "r_5", "r_3", "r_2", "r_1", "r_0"})

	// The cursor of before, a plain run id, still pages from a run that exists.
	if got, _, _ := f.runsPage(t, "/admin/runs?user=exporter&limit=2&after=r_5"); !slices.Equal(got, []string{"r_3", "r_2"}) {
		t.Errorf("after=r_5: %v, want [r_3 r_2]", got)
	}
	for _, tc := range []struct{ after, says string }{
		{"r_4", "no run"}, // a plain run id of a pruned run: its position is gone with it
		{"created/yesterday/r_1", "time"},
		{"created/2026-03-08T00:00:00.000000Z/", "run id"},
		{"created/2026-03-08T00:00:00Z/r_1", "time"},
		{"settled/2026-03-08T00:00:00.000000Z/r_1", "settlement"}, // a by-settlement cursor, on a listing by creation
		{"created/2026-03-08T00:00:00.000000Z/" + strings.Repeat("r", 65), "run id"},
		{"created/2026-03-08T00:00:00.000000Z/r_\xff", "run id"},
	} {
		out := f.admin("GET", "/admin/runs?after="+url.QueryEscape(tc.after), nil, http.StatusBadRequest)
		msg, _ := out["error"].(map[string]any)["message"].(string)
		if errCode(out) != "invalid_after" || !strings.Contains(msg, tc.says) {
			t.Errorf("after=%q: %v, want 400 invalid_after saying %q", tc.after, out, tc.says)
		}
	}
	settledSince := "&settled_since=" + url.QueryEscape(time.Now().UTC().Add(-40*24*time.Hour).Format(time.RFC3339))
	if out := f.admin("GET", "/admin/runs?after=created/2026-03-08T00:00:00.000000Z/r_1"+settledSince, nil, http.StatusBadRequest); errCode(out) != "invalid_after" {
		t.Errorf("a by-creation cursor on a listing by settlement: %v, want 400 invalid_after", out)
	}
}
