package holds_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestPruneBatchOfManyModelsStaysWithinTheServersPlaceholders: a batch adds its runs into
// pruned_runs, a row per user, day and model with 18 values. One INSERT for a whole batch of
// MaxPruneBatch runs of as many models held up to 180 000 placeholders, where the server takes
// 65 535 in a statement: it worked only while the driver wrote the values into the text
// itself, which it does not for a statement past the DSN's maxAllowedPacket (set lower, or 0:
// the server's) — that one went to the server as a prepared statement, refused (1390), and the
// prune failed at that batch however often it was run again. 40 users of 100 models each
// here: 4 000 rows, 72 000 values, about 330 KiB written out; the DSN's 300 KiB packet sends
// that statement prepared (its text with placeholders is less), as maxAllowedPacket=0 and a
// server's 1 MiB did a batch of 10 000 (2.5 MB written out with long model names). (A packet
// smaller than the prepared statement too failed the batch as a bad connection, tried again
// until the prune's deadline.)
func TestPruneBatchOfManyModelsStaysWithinTheServersPlaceholders(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	db := testenv.Open(t, dsn)
	f := &acctFixture{t: t, db: db, store: holds.NewStore(db, acctPlans(), "standard", zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))}
	const users, models = 40, holds.MaxPrunedModels
	for i := range users {
		u := f.user(fmt.Sprintf("models-%02d", i), "standard")
		var q strings.Builder
		q.WriteString(`INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, model, expires_at, created_at, settled_at) VALUES `)
		args := make([]any, 0, 3*models)
		for m := range models {
			if m > 0 {
				q.WriteString(", ")
			}
			q.WriteString("(?, ?, 'settled', 0, 0, ?, NOW(6), NOW(6) - INTERVAL 10 DAY, NOW(6) - INTERVAL 10 DAY)")
			args = append(args, fmt.Sprintf("r_%02d_%03d", i, m), u.ID, fmt.Sprintf("model-%03d", m))
		}
		if _, err := f.db.ExecContext(f.ctx(), q.String(), args...); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxAllowedPacket = 300 << 10
	small := testenv.Open(t, cfg.FormatDSN())
	f.store = holds.NewStore(small, acctPlans(), "standard", zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))

	res, err := f.store.PruneSettled(f.ctx(), holds.MinPruneAge, holds.MaxPruneBatch)
	if err != nil {
		t.Fatalf("prune of %d runs of %d models each: %v", users*models, models, err)
	}
	var rows int
	if err := f.db.GetContext(f.ctx(), &rows, "SELECT COUNT(*) FROM pruned_runs"); err != nil {
		t.Fatal(err)
	}
	if res.Runs != users*models || res.Batches != 1 || rows != users*models {
		t.Fatalf("pruned %d runs in %d batches into %d rows, want %d runs in one batch into as many rows", res.Runs, res.Batches, rows, users*models)
	}
}
