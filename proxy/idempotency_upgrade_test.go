package proxy_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/proxy"
)

// TestIdemRecordOfAnOlderGatewayIsReplayed: a gateway before the route was hashed with the body
// stored a key's body hash alone. A retry reaching a newer gateway during a rolling upgrade was
// answered 422 idempotency_key_reused for the record's 24 h, and a client that then retries
// under a new key is charged twice. The older form is recognised: the retry is replayed; another
// body under the key is still 422.
func TestIdemRecordOfAnOlderGatewayIsReplayed(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "upgrade-spanning"}
	sendOK(t, "first", h.gw.URL, key, chatBody, idem)
	h.settled()

	// The record as the older gateway wrote it: sha256 of the body alone.
	ctx := context.Background()
	recs, err := h.rdb.Keys(ctx, h.keys.Prefix+"replay:*").Result()
	if err != nil || len(recs) == 0 {
		t.Fatalf("replay records %v (%v), want the key's", recs, err)
	}
	sum := sha256.Sum256([]byte(chatBody))
	for _, rec := range recs {
		if h.rdb.HExists(ctx, rec, "body").Val() {
			if err := h.rdb.HSet(ctx, rec, "body", hex.EncodeToString(sum[:])).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}

	calls := h.fake.Calls()
	retry := send(h.gw.URL, key, chatBody, idem)
	if retry.status != http.StatusOK || retry.header.Get(proxy.ReplayedHeader) != "true" || h.fake.Calls() != calls {
		t.Fatalf("retry against an older gateway's record: %d %s (replayed %q, upstream calls %d -> %d), want its replay",
			retry.status, retry.body, retry.header.Get(proxy.ReplayedHeader), calls, h.fake.Calls())
	}
	other := send(h.gw.URL, key, `{"model":"fake-gpt","messages":[{"role":"user","content":"another"}]}`, idem)
	if other.status != http.StatusUnprocessableEntity {
		t.Fatalf("another body under the key: %d %s, want 422", other.status, other.body)
	}
}
