package admin_test

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// walk pages a listing at base (a path with its query, without limit and after) limit rows at
// a time, following has_more and last_id, and returns the rows' ids (field idField) in the
// order listed. Every full page but the last must say has_more, the last must not, and no
// page may be empty unless the listing is.
func (f *fixture) walk(t *testing.T, base string, limit int, idField string) []string {
	t.Helper()
	sep := "?"
	if u, _ := url.Parse(base); u.RawQuery != "" {
		sep = "&"
	}
	var ids []string
	path := fmt.Sprintf("%s%slimit=%d", base, sep, limit)
	for page := 0; ; page++ {
		if page > 100 {
			t.Fatalf("%s: the listing never ends", base)
		}
		out := f.admin("GET", path, nil, http.StatusOK)
		data, _ := out["data"].([]any)
		for _, row := range data {
			ids = append(ids, fmt.Sprint(row.(map[string]any)[idField]))
		}
		more, ok := out["has_more"].(bool)
		if !ok {
			t.Fatalf("GET %s: no has_more in %v", path, out)
		}
		if len(data) == 0 {
			if page > 0 || more {
				t.Fatalf("GET %s: an empty page (has_more %v) after %d rows: the page before it said has_more", path, more, len(ids))
			}
			return ids
		}
		if len(data) > limit {
			t.Fatalf("GET %s: %d rows, over the limit", path, len(data))
		}
		if !more {
			if _, ok := out["last_id"]; !ok {
				t.Fatalf("GET %s: a page with rows and no last_id", path)
			}
			return ids
		}
		if len(data) != limit {
			t.Fatalf("GET %s: has_more on a page of %d rows, short of the limit %d", path, len(data), limit)
		}
		path = fmt.Sprintf("%s%slimit=%d&after=%s", base, sep, limit, url.QueryEscape(fmt.Sprint(out["last_id"])))
	}
}

// checkWalks pages base by every limit from 1 to one past the row count and checks that each
// walk lists every row once, in the order of the whole listing.
func (f *fixture) checkWalks(t *testing.T, base, idField string, want []string) {
	t.Helper()
	if all := f.walk(t, base, 1000, idField); !slices.Equal(all, want) {
		t.Fatalf("%s whole: %v, want %v", base, all, want)
	}
	for limit := 1; limit <= len(want)+1; limit++ {
		if got := f.walk(t, base, limit, idField); !slices.Equal(got, want) {
			t.Errorf("%s by %d: %v, want each of %v once, in order", base, limit, got, want)
		}
	}
}

// TestUsersListingPages: GET /admin/users took ?after=<name> but answered no has_more and no
// last_id, so a client could not tell the last page from a full one. It pages as the grants
// and runs listings do, by name (unique under the column's collation, so the order is total).
// A cursor that is not UTF-8, which MariaDB compares without an error and lists nothing
// after, is 400 invalid_after, not an empty last page.
func TestUsersListingPages(t *testing.T) {
	f := newFixture(t, adminToken)
	names := []string{"Bob", "alice", "carol.x", "Dave", "eve@x", "0zero", "b-2", "Z"}
	for _, n := range names {
		f.admin("POST", "/admin/users", map[string]any{"name": n}, http.StatusCreated)
	}
	whole := f.walk(t, "/admin/users", 1000, "name")
	if len(whole) != len(names) {
		t.Fatalf("whole listing %v, want the %d users", whole, len(names))
	}
	f.checkWalks(t, "/admin/users", "name", whole)
	for _, bad := range []string{"%FF", "a%C3"} {
		if out := f.admin("GET", "/admin/users?after="+bad, nil, http.StatusBadRequest); errCode(out) != "invalid_after" {
			t.Errorf("after=%s: %v, want 400 invalid_after", bad, out)
		}
	}
}

// TestKeysListingPages: a user's keys were listed up to the limit (at most 1 000) with no
// cursor, so past the first page they could not be listed at all. The listing pages newest
// first by (created_at, id): keys created in one microsecond still come once each. A cursor
// that is no key id of this user is 400 invalid_after.
func TestKeysListingPages(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "keyed"}, http.StatusCreated)
	f.admin("POST", "/admin/users", map[string]any{"name": "other"}, http.StatusCreated)
	for range 7 {
		f.admin("POST", "/admin/users/keyed/keys", nil, http.StatusCreated)
	}
	otherKey := f.admin("POST", "/admin/users/other/keys", nil, http.StatusCreated)
	// Four of them created at one instant, older than the rest: only the id can order them.
	u, err := f.store.UserByName(f.ctx(), "keyed")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.ExecContext(f.ctx(), "UPDATE api_keys SET created_at = ? WHERE user_id = ? ORDER BY id LIMIT 4",
		time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), u.ID); err != nil {
		t.Fatal(err)
	}
	rows, err := f.store.ListKeys(f.ctx(), u.ID, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, k := range rows {
		want = append(want, strconv.FormatUint(k.ID, 10))
	}
	if len(want) != 7 {
		t.Fatalf("%d keys, want 7", len(want))
	}
	f.checkWalks(t, "/admin/users/keyed/keys", "id", want)

	var otherID string
	for _, k := range f.admin("GET", "/admin/users/other/keys", nil, http.StatusOK)["data"].([]any) {
		otherID = fmt.Sprint(k.(map[string]any)["id"])
		if k.(map[string]any)["prefix"] != otherKey["prefix"] {
			t.Fatalf("other's listing %v, want its one key %v", k, otherKey["prefix"])
		}
	}
	for _, bad := range []string{"x", "0", "-1", "99999999", otherID} {
		if out := f.admin("GET", "/admin/users/keyed/keys?after="+bad, nil, http.StatusBadRequest); errCode(out) != "invalid_after" {
			t.Errorf("after=%s: %v, want 400 invalid_after", bad, out)
		}
	}
}

// TestFullLastPageSaysNoMore: grants and runs said has_more whenever a page was full, so a
// listing whose rows filled its last page exactly sent the client for one more, empty page.
// Each listing now reads one row past the limit to know. An unknown run id as the cursor is
// 400 invalid_after, as an unknown key id is.
func TestFullLastPageSaysNoMore(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "payer"}, http.StatusCreated)
	f.admin("PATCH", "/admin/users/payer", map[string]any{"max_in_flight": 10}, http.StatusOK)
	u, err := f.store.UserByName(f.ctx(), "payer")
	if err != nil {
		t.Fatal(err)
	}
	var grantIDs []string
	var reqs []holds.AdmitRequest
	for i := range 4 {
		g := f.admin("POST", "/admin/users/payer/grants", map[string]any{"amount": "1", "idempotency_key": "evt_" + strconv.Itoa(i)}, http.StatusCreated)
		grantIDs = append([]string{fmt.Sprint(g["id"])}, grantIDs...)
		reqs = append(reqs, holds.AdmitRequest{RunID: fmt.Sprintf("r_%d", i), UserID: u.ID, Model: "m",
			State: holds.StateQueued, TTL: time.Minute})
	}
	f.admitInOneBatch(reqs) // one batch: the four share created_at
	f.checkWalks(t, "/admin/users/payer/grants", "id", grantIDs)
	f.checkWalks(t, "/admin/runs?user=payer", "id", []string{"r_3", "r_2", "r_1", "r_0"})
	if out := f.admin("GET", "/admin/runs?after=r_nope", nil, http.StatusBadRequest); errCode(out) != "invalid_after" {
		t.Errorf("after=r_nope: %v, want 400 invalid_after", out)
	}
}
