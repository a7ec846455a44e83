package holds_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestWriterStampsEachAdmissionWithItsServer: a writer's admissions carry the serving
// instance's id (run_holds.served_by, what the reconciler finds a dead process's holds by),
// read at each admission: a process declared dead and registered again stamps its new id from
// then on. A hold stamped with no id, or the old one, is never released as its server's.
func TestWriterStampsEachAdmissionWithItsServer(t *testing.T) {
	db, st, users := storeWithUsers(t, "servedby", 1)
	u := users[0]
	ctx := context.Background()
	var id atomic.Value
	id.Store(testenv.RandomID(16))
	w := holds.NewWriter(st, holds.WriterConfig{AdmitTimeout: 10 * time.Second, SettleTimeout: 10 * time.Second,
		ServedBy: func() string { return id.Load().(string) }})
	defer w.Close()
	for _, run := range []string{"r_servedby_old", "r_servedby_new"} {
		want := id.Load().(string)
		if _, err := w.Admit(ctx, holds.AdmitRequest{RunID: run, UserID: u.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true}); err != nil {
			t.Fatal(err)
		}
		var got *string
		if err := db.Get(&got, "SELECT served_by FROM run_holds WHERE run_id = ?", run); err != nil {
			t.Fatal(err)
		}
		if got == nil || *got != want {
			t.Errorf("hold %s served by %v, want the instance's id at its admission %q", run, got, want)
		}
		if _, err := w.Settle(ctx, holds.Settlement{RunID: run, UserID: u.ID, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
		id.Store(testenv.RandomID(16)) // registered again under a new id
	}
}
