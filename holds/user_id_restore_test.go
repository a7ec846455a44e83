package holds_test

import (
	"sync"
	"testing"
)

// A database restored from a backup has forgotten the users created since, while Redis still
// holds their state under their ids (a named run's tally under a run id hashed from the user's
// id and the run's name, an Idempotency-Key's answer likewise). The restored table's
// AUTO_INCREMENT is the backup's, so the next user created took the id of the first one lost:
// live, a new user's named run "task-1" opened on the lost user's tally, and its settle charged
// the new user the lost user's call. A new user's id must be above every id ever given.
func TestUserIDNotGivenAgainAfterARestore(t *testing.T) {
	e := newStoreEnv(t)
	ctx := e.ctx()
	e.user("kept", 3, nil)
	// The backup: the table as it was, its next id included (mariadb-dump writes it into the
	// CREATE TABLE it restores).
	var next uint64
	if err := e.db.GetContext(ctx, &next, `SELECT AUTO_INCREMENT FROM information_schema.TABLES
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'users'`); err != nil {
		t.Fatal(err)
	}
	lost := e.user("lost", 3, nil)
	// The restore: the row created after the backup is gone, the counter is the backup's.
	if _, err := e.db.ExecContext(ctx, "DELETE FROM users WHERE id = ?", lost.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.ExecContext(ctx, "ALTER TABLE users AUTO_INCREMENT = ?", next); err != nil {
		t.Fatal(err)
	}
	after := e.user("after", 3, nil)
	if after.ID <= lost.ID {
		t.Fatalf("user created after the restore got id %d; the user lost with the restore had %d: "+
			"its Redis state (named runs' tallies, kept answers) is now the new user's", after.ID, lost.ID)
	}
}

// Users created at once each get an id of their own (one whose id another took tries again),
// and every one of them is created.
func TestUsersCreatedAtOnceGetIDsOfTheirOwn(t *testing.T) {
	e := newStoreEnv(t)
	const n = 12
	ids := make([]uint64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u, err := e.store.CreateUser(e.ctx(), "at-once-"+string(rune('a'+i)), "standard")
			ids[i], errs[i] = u.ID, err
		}()
	}
	wg.Wait()
	seen := map[uint64]bool{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("user %d: %v", i, err)
		}
		if seen[ids[i]] {
			t.Fatalf("id %d given twice: %v", ids[i], ids)
		}
		seen[ids[i]] = true
	}
	var rows int
	if err := e.db.GetContext(e.ctx(), &rows, "SELECT COUNT(*) FROM users"); err != nil {
		t.Fatal(err)
	}
	if rows != n {
		t.Fatalf("%d users in the table, want %d", rows, n)
	}
}

// A user whose id is above the database clock in µs — given while the clock stood ahead (a host
// whose clock was stepped back since, a backup restored onto a host whose clock is behind the
// old one's) — must not stop user creation: the next id is above it, one more than the highest,
// not the highest itself, which is taken, and refused every try.
func TestUserIDAboveTheDatabaseClockIsFollowedNotRepeated(t *testing.T) {
	e := newStoreEnv(t)
	ctx := e.ctx()
	var ahead uint64
	if err := e.db.GetContext(ctx, &ahead, "SELECT CAST(FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000000) AS UNSIGNED) + 86400000000"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.ExecContext(ctx, "INSERT INTO users (id, name, plan) VALUES (?, 'ahead', 'standard')", ahead); err != nil {
		t.Fatal(err)
	}
	u, err := e.store.CreateUser(ctx, "after-ahead", "standard")
	if err != nil {
		t.Fatalf("user created after one whose id (%d) is a day ahead of the clock: %v", ahead, err)
	}
	if u.ID != ahead+1 {
		t.Errorf("new user's id %d, want %d: one above the highest", u.ID, ahead+1)
	}
}

// With the highest id ahead of the database clock, every id is the highest + 1, so users
// created at once read the same highest and all but one find their id taken: each such one,
// its name free, tries again with the new highest (not refused as a name taken), and every one
// is created, each with an id of its own.
func TestUsersCreatedAtOnceAboveTheDatabaseClockEachTryAgain(t *testing.T) {
	e := newStoreEnv(t)
	ctx := e.ctx()
	if _, err := e.db.ExecContext(ctx, `INSERT INTO users (id, name, plan)
		VALUES (CAST(FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000000) AS UNSIGNED) + 86400000000, 'ahead', 'standard')`); err != nil {
		t.Fatal(err)
	}
	const n = 8
	ids := make([]uint64, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			u, err := e.store.CreateUser(ctx, "ahead-at-once-"+string(rune('a'+i)), "standard")
			ids[i], errs[i] = u.ID, err
		}()
	}
	close(start)
	wg.Wait()
	seen := map[uint64]bool{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("user %d: %v", i, err)
		}
		if seen[ids[i]] {
			t.Fatalf("id %d given twice: %v", ids[i], ids)
		}
		seen[ids[i]] = true
	}
}

// A new user's id is at least the database clock in microseconds since the epoch, read before
// the user is created: the ids a fleet has given are in that unit, and a restore forgets the
// last of them. An id in a coarser unit (milliseconds) falls a thousandfold below the ids
// already given, the highest kept id + 1 decides alone, and after a restore that is the id of
// the first user lost, whose Redis state the new user takes.
func TestUserIDIsAtLeastTheDatabaseClockInMicroseconds(t *testing.T) {
	e := newStoreEnv(t)
	ctx := e.ctx()
	var before uint64
	if err := e.db.GetContext(ctx, &before, "SELECT CAST(FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000000) AS UNSIGNED)"); err != nil {
		t.Fatal(err)
	}
	u, err := e.store.CreateUser(ctx, "clocked", "standard")
	if err != nil {
		t.Fatal(err)
	}
	if u.ID < before {
		t.Fatalf("user created at database time %d µs got id %d: below the clock in µs, the unit of the ids already given", before, u.ID)
	}
}
