package holds_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestReportsOutwaitTheReadTimeout: a money path gives up on a reply slower than the read
// timeout, but `gateway audit` and `gateway report` group every settled hold before their
// first row, which on millions of holds takes longer: OpenForReports sets no read timeout, so a
// statement slower than Open's is answered (the command's context bounds it instead). The
// timeout is shortened to 1 s here; the statement takes 2.
func TestReportsOutwaitTheReadTimeout(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	defer holds.SetDefaultReadTimeout(time.Second)()
	ctx := context.Background()

	money, err := holds.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer money.Close()
	if _, err := money.ExecContext(ctx, "DO SLEEP(2)"); err == nil {
		t.Fatal("a 2 s statement on the money paths' handle outlived its 1 s read timeout")
	}

	reports, err := holds.OpenForReports(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer reports.Close()
	if _, err := reports.ExecContext(ctx, "DO SLEEP(2)"); err != nil {
		t.Fatalf("a 2 s statement on the reports' handle: %v", err)
	}
	// Its context still bounds it.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := reports.ExecContext(short, "DO SLEEP(2)"); err == nil {
		t.Fatal("a 2 s statement on the reports' handle outlived its context's 200 ms")
	}
}
