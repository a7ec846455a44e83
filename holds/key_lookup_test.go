package holds_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestKeyLookupAnswersEachLookupOfABatch: lookups that queue while the only worker waits for
// the database share its next batch, and each is answered its own key's user (or ErrBadKey
// for a revoked key), not a batch-mate's. After Close a lookup is refused ErrBatcherClosed.
// The store has one connection, held here until the lookups have queued.
func TestKeyLookupAnswersEachLookupOfABatch(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	type want struct {
		key  string
		user uint64 // 0: a revoked key
	}
	var wants []want
	for i := range 4 {
		u, err := f.store.CreateUser(ctx, fmt.Sprintf("lookup-%d-%d", i, f.user.ID), "standard")
		if err != nil {
			t.Fatal(err)
		}
		key, err := f.store.CreateKey(ctx, u.ID)
		if err != nil {
			t.Fatal(err)
		}
		wants = append(wants, want{key, u.ID})
	}
	revoked, err := f.store.CreateKey(ctx, f.user.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.store.RevokeKey(ctx, revoked); err != nil {
		t.Fatal(err)
	}
	wants = append(wants, want{revoked, 0})

	db := f.store.DB()
	db.SetMaxOpenConns(1)
	defer db.SetMaxOpenConns(0)
	conn, err := db.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Closed below, not deferred: a lookup after Close that panicked would deadlock a deferred one.
	k := holds.NewKeyLookup(f.store, holds.BatcherConfig{Workers: 1, Timeout: time.Minute})
	errs := make(chan error, len(wants)+1)
	lookup := func(w want) {
		u, err := k.User(ctx, w.key)
		switch {
		case w.user == 0 && !errors.Is(err, holds.ErrBadKey):
			err = fmt.Errorf("revoked key: %+v, %v; want ErrBadKey", u, err)
		case w.user != 0 && err == nil && u.ID != w.user:
			err = fmt.Errorf("key of user %d answered user %d", w.user, u.ID)
		case w.user == 0:
			err = nil
		}
		errs <- err
	}
	// The first lookup's batch takes the worker and waits for the connection.
	go lookup(wants[0])
	deadline := time.Now().Add(10 * time.Second)
	for db.Stats().WaitCount == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first lookup's batch did not come to wait for the connection")
		}
		time.Sleep(time.Millisecond)
	}
	for _, w := range wants {
		go lookup(w)
	}
	waitQueued(t, k, len(wants))
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	for range len(wants) + 1 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	k.Close()
	if _, err := k.User(ctx, wants[0].key); !errors.Is(err, holds.ErrBatcherClosed) {
		t.Fatalf("lookup after Close: %v, want ErrBatcherClosed", err)
	}
}

// waitQueued waits until n lookups wait in k's queue.
func waitQueued(t *testing.T, k *holds.KeyLookup, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for k.Queued() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d lookups queued, want %d", k.Queued(), n)
		}
		time.Sleep(time.Millisecond)
	}
}
