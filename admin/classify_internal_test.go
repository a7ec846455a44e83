package admin

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
)

// TestBusyDatabaseIsUnavailableNot500: a statement that waited out the lock wait timeout past
// the store's retries, or a request whose deadline ran out waiting for the database, is the
// database too busy to answer now — 503 with a retry hint, as for an unreachable one — not a
// 500 that tells the operator's script the request itself is broken.
func TestBusyDatabaseIsUnavailableNot500(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("grant: %w", &mysql.MySQLError{Number: 1205, Message: "Lock wait timeout exceeded"}),
		fmt.Errorf("grant: %w", &mysql.MySQLError{Number: 1213, Message: "Deadlock found"}),
		fmt.Errorf("list runs: %w", context.DeadlineExceeded),
	} {
		if e := classify(err); e.Status != http.StatusServiceUnavailable || e.Code != "billing_unavailable" || e.RetryAfter == 0 {
			t.Errorf("%v: %d %s (retry after %v), want 503 billing_unavailable with a retry hint", err, e.Status, e.Code, e.RetryAfter)
		}
	}
	if e := classify(fmt.Errorf("odd: %w", &mysql.MySQLError{Number: 1064})); e.Status != http.StatusInternalServerError {
		t.Errorf("a query the database refused: %d, want 500", e.Status)
	}
}

// TestBadListingLimitIs400: a page size the store refuses (from the gateway's subcommands, or
// any caller past limitParam) is a bad request, as every listing's bad filter is: the
// instances' listing panicked on it and the grants' answered 500.
func TestBadListingLimitIs400(t *testing.T) {
	st := holds.NewStore(nil, map[string]holds.Plan{"standard": {}}, "standard", zap.NewNop())
	ctx := context.Background()
	for _, limit := range []int{0, MaxListLimit * 100} {
		_, ierr := st.ListInstances(ctx, "", limit)
		_, gerr := st.Grants(ctx, 1, 0, limit)
		for _, err := range []error{ierr, gerr} {
			if e := classify(err); e.Status != http.StatusBadRequest || e.Code != "invalid_request" {
				t.Errorf("limit %d: %v answered %d %s; want 400 invalid_request", limit, err, e.Status, e.Code)
			}
		}
	}
}
