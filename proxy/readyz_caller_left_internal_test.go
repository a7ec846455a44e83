package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/plans"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
)

// TestReadinessCheckOutlivesTheCallerWhoAskedForIt: /readyz's check is shared (readiness): the
// callers who ask while it runs, and for readyFor after, get its answer. Run under the asking
// caller's context, a caller who left mid-check (a load balancer's probe timing out) ended it,
// and every probe for the next second was told both stores were unavailable though both were
// up. A check asked for by a caller already gone still checks, and answers 200.
func TestReadinessCheckOutlivesTheCallerWhoAskedForIt(t *testing.T) {
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	cfg := config.Default()
	s := &Server{cfg: cfg, store: holds.NewStore(db, plans.FromConfig(cfg), "standard", zap.NewNop()), rdb: rdb,
		keys: runstate.Keys{Prefix: prefix}, log: zap.NewNop()}
	gone, leave := context.WithCancel(context.Background())
	leave()
	w := httptest.NewRecorder()
	s.ready(w, httptest.NewRequest(http.MethodGet, "/readyz", nil).WithContext(gone))
	if w.Code != http.StatusOK || strings.Contains(w.Body.String(), "unavailable") {
		t.Fatalf("/readyz asked by a caller who left: %d %s, want 200 with both stores ok", w.Code, w.Body)
	}
	// The next caller, within readyFor, is given the same answer.
	w = httptest.NewRecorder()
	s.ready(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if w.Code != http.StatusOK {
		t.Fatalf("/readyz after it: %d %s, want 200", w.Code, w.Body)
	}
}
