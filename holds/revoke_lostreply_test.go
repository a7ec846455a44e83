package holds_test

import (
	"context"
	"testing"

	"github.com/tollgate/tollgate/internal/testenv"
)

// TestRevokeByPrefixLostReply: the server revokes a user's keys by prefix but the reply is lost
// with the connection. The store retries the statement, which then changes nothing (the keys
// are already revoked), and answered ErrKeyNotFound: the operator was told no live key
// matched (the admin API's 404 key_not_found) while the keys had just been revoked by this very
// request. The retry must answer what the request did.
func TestRevokeByPrefixLostReply(t *testing.T) {
	f, lossy := newLossyFixture(t)
	ctx := context.Background()
	key, err := f.store.CreateKey(ctx, f.user.ID)
	if err != nil {
		t.Fatal(err)
	}
	lossy.Arm("UPDATE api_keys SET revoked_at", testenv.LoseReply)
	n, err := f.store.RevokeKeysByPrefix(ctx, f.user.ID, key[:10])
	if !lossy.Fired() {
		t.Fatal("the revocation's reply was never lost")
	}
	if err != nil || n != 1 {
		t.Fatalf("revoke by prefix whose reply was lost: %d, %v; want the 1 key it revoked", n, err)
	}
	if _, err := f.store.UserByKey(ctx, key); err == nil {
		t.Fatal("the key still works")
	}
	// A second request for the same prefix finds no live key: that is a 404.
	if n, err := f.store.RevokeKeysByPrefix(ctx, f.user.ID, key[:10]); err == nil {
		t.Fatalf("revoking an already revoked prefix: %d, nil; want ErrKeyNotFound", n)
	}
}
