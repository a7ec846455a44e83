package runstate_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
)

// TestTallyJoinsAddOnlyThroughItsOwnClient: a command on another client's server (a dedup Redis
// of its own) may not ride in the tally's MULTI/EXEC, though both are single servers and any
// keys may share a transaction on either: there it would be written to the tally's server, not
// its own.
func TestTallyJoinsAddOnlyThroughItsOwnClient(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	other := redis.NewClient(rdb.Options())
	t.Cleanup(func() { other.Close() })
	tally := runstate.NewTally(rdb, keys, time.Hour)
	const run = "r_0123456789abcdef0123456789abcdef"
	fp := keys.Dedup(7, "abc")
	if !tally.JoinsAdd(rdb, run, fp) {
		t.Error("the tally's own client: a fingerprint may ride in its transaction")
	}
	if tally.JoinsAdd(other, run, fp) {
		t.Error("another server's client: its fingerprint may not ride in the tally's transaction")
	}
}
