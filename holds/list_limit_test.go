package holds_test

import (
	"errors"
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// TestListingsRefuseABadLimitAsABadFilter: a page size outside 1-MaxListRows is refused as
// every listing refuses one (ListUsers, ListKeys, ListRuns): ErrBadFilter, which the admin API
// answers 400. The instances' listing panicked on it, and the grants' returned an error of no
// kind, answered 500.
func TestListingsRefuseABadLimitAsABadFilter(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("bad-limit", "standard")
	for _, limit := range []int{0, -1, holds.MaxListRows + 1} {
		if _, err := f.store.ListInstances(f.ctx(), "", limit); !errors.Is(err, holds.ErrBadFilter) {
			t.Errorf("instances, limit %d: %v; want ErrBadFilter", limit, err)
		}
		if _, err := f.store.Grants(f.ctx(), u.ID, 0, limit); !errors.Is(err, holds.ErrBadFilter) {
			t.Errorf("grants, limit %d: %v; want ErrBadFilter", limit, err)
		}
	}
	// The bound itself is a page.
	if _, err := f.store.ListInstances(f.ctx(), "", holds.MaxListRows); err != nil {
		t.Errorf("instances, limit %d: %v", holds.MaxListRows, err)
	}
	if _, err := f.store.Grants(f.ctx(), u.ID, 0, holds.MaxListRows); err != nil {
		t.Errorf("grants, limit %d: %v", holds.MaxListRows, err)
	}
}
