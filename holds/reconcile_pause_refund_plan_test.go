package holds_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestReconcileRevisitReadsTheChargedHeldRunsAlone: each pass lists the one-call runs charged
// their hold within tally_ttl that have no pause refund (refundPaused). They are a handful among
// every run settled in that window (a day's settlements, in production millions): the list must
// be a range of the (settle_source, settled_at) index, in its order, each run's grant looked up
// by its unique key — not the day's settlements read row by row at every pass.
func TestReconcileRevisitReadsTheChargedHeldRunsAlone(t *testing.T) {
	f := newAcctFixture(t)
	ctx := f.ctx()
	u := f.user("revisit-plan", "standard")
	recent := time.Now().UTC().Add(-time.Hour)
	for chunk := 0; chunk < 10; chunk++ {
		var q strings.Builder
		var args []any
		q.WriteString(`INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, charged_micro, expires_at, settled_at, settle_source) VALUES `)
		for i := 0; i < 3000; i++ {
			if i > 0 {
				q.WriteByte(',')
			}
			at := recent.Add(time.Duration(i) * time.Millisecond)
			source := "complete"
			if chunk == 0 && i%300 == 0 {
				source = "reconcile_hold"
			}
			q.WriteString("(?, ?, 'settled', 0, 0, 0, ?, ?, ?)")
			args = append(args, fmt.Sprintf("r_revisit_%02d_%05d", chunk, i), u.ID, at, at, source)
		}
		if _, err := f.db.ExecContext(ctx, q.String(), args...); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.db.ExecContext(ctx, "ANALYZE TABLE run_holds"); err != nil {
		t.Fatal(err)
	}
	for name, after := range map[string]string{"first batch": "", "after a cursor": "r_revisit_00_00300"} {
		t.Run(name, func(t *testing.T) {
			stmt, args := holds.ChargedHeldQuery(recent.Add(300*time.Millisecond), after, 48*time.Hour, 200)
			rows, err := f.db.QueryxContext(ctx, "EXPLAIN "+stmt, args...)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			for rows.Next() {
				row := map[string]any{}
				if err := rows.MapScan(row); err != nil {
					t.Fatal(err)
				}
				switch str(row["table"]) {
				case "run_holds":
					if extra := str(row["Extra"]); strings.Contains(extra, "filesort") || str(row["key"]) != "idx_run_holds_source_settled" {
						t.Errorf("the list reads run_holds by %q with %q, want the (settle_source, settled_at) index in its order", str(row["key"]), extra)
					}
				case "g":
					if str(row["key"]) != "uq_grants_idempotency_key" {
						t.Errorf("the list looks a run's grant up by %q (%v), want the grant key's unique index", str(row["key"]), row)
					}
				}
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
