package e2e

import (
	"context"
	"io"
	"net/http"
	"testing"
)

// TestNewUserAfterARestoreIsNotChargedALostUsersRun: a database restored from a backup has
// forgotten a user created after it, while Redis still holds that user's named run — its tally,
// and its settle's mark — under a run id hashed from the user's id and the run's name. The table's
// next id being the backup's, the first user created after the restore took the lost user's id:
// its own run of the same name was refused 409 run_settled (the lost run's settle's mark), and
// once it opened, its settle charged it the lost user's calls as well as its own.
func TestNewUserAfterARestoreIsNotChargedALostUsersRun(t *testing.T) {
	w := newWorld(t)
	g := w.startGateway("gw")
	ctx := context.Background()
	// The backup: the users table's next id is in it (mariadb-dump writes it into the CREATE
	// TABLE it restores).
	var next uint64
	if err := w.db.Get(&next, `SELECT AUTO_INCREMENT FROM information_schema.TABLES
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'users'`); err != nil {
		t.Fatal(err)
	}
	lost, lostKey := w.user("lost", 3, nil)
	task := map[string]string{"X-Run-Id": "task-1"}
	completeCall(t, g, lostKey, chatBody(false, 20, "the lost user's call"), task)
	if status, out := settleRunOn(t, g, lostKey, "task-1"); status != http.StatusOK {
		t.Fatalf("settle of the lost user's run: %d %v", status, out)
	}
	// The restore: what the database learned of the lost user is gone, the counter is the
	// backup's; Redis goes on as it was.
	for _, q := range []string{"DELETE FROM run_holds WHERE user_id = ?", "DELETE FROM usage_days WHERE user_id = ?",
		"DELETE FROM api_keys WHERE user_id = ?", "DELETE FROM users WHERE id = ?"} {
		if _, err := w.db.Exec(q, lost.ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.db.Exec("ALTER TABLE users AUTO_INCREMENT = ?", next); err != nil {
		t.Fatal(err)
	}

	fresh, key := w.user("fresh", 3, nil)
	resp := post(t, ctx, g, key, chatBody(false, 20, "the new user's own call"), task)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("user %d, created after the restore (the lost one was %d): its first call of its own run: %d %s",
			fresh.ID, lost.ID, resp.StatusCode, raw)
	}
	status, out := settleRunOn(t, g, key, "task-1")
	if status != http.StatusOK {
		t.Fatalf("settle of the new user's run: %d %v", status, out)
	}
	usage, _ := out["usage"].(map[string]any)
	if calls, _ := usage["calls"].(float64); calls != 1 {
		t.Fatalf("the new user's run settled with %v calls (%v), want its one call: it was charged the lost user's", usage["calls"], out)
	}
}
