package proxy_test

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestGatewayOnAClusterClient: the gateway's Redis steps through a Cluster client, which
// refuses a transaction or script across hash slots as a Redis Cluster does. A plain call's
// tally rode in one MULTI/EXEC with the give-back of its fingerprint (tallyWithFingerprint),
// which is in its user's slot, not its run's: the Cluster client refused the transaction whole
// (ErrCrossSlot), and every plain call went untallied (a warning each, its settlement the only
// record). Now the two go apart on a Cluster client. A named run's calls (reservations, leases,
// tally), its settlement, a session's new message stopping its old one on another process (the
// cancel channel), a Responses continuation's records, and an Idempotency-Key request and its
// replay work as on one server.
func TestGatewayOnAClusterClient(t *testing.T) {
	for _, c := range []struct {
		name string
		kind clusterKind
	}{{"client", clusterOn}, {"real cluster", realCluster}} {
		t.Run(c.name, func(t *testing.T) { gatewayOnACluster(t, c.kind) })
	}
}

// clusterKeys are the keys matching pattern on every master of the gateway's Cluster.
func clusterKeys(t *testing.T, h *harness, pattern string) []string {
	t.Helper()
	var mu sync.Mutex
	var keys []string
	err := h.gwRDB.(*redis.ClusterClient).ForEachMaster(context.Background(), func(ctx context.Context, node *redis.Client) error {
		ks, err := node.Keys(ctx, pattern).Result()
		mu.Lock()
		keys = append(keys, ks...)
		mu.Unlock()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func gatewayOnACluster(t *testing.T, kind clusterKind) {
	h := newHarnessOn(t, harnessSetup{cluster: kind}, nil)
	ctx := context.Background()
	u, key := h.user("standard")

	resp, _ := h.postOK(t, key, "/v1/chat/completions", chatBody, map[string]string{fakellm.HeaderChunks: "5"}) // plain call
	runID := resp.Header.Get(proxy.RunIDHeader)
	h.settled()
	r := h.run(u.ID, runID)
	tl, found, err := h.tally.Get(ctx, runID)
	if err != nil || !found || tl.Calls != 1 || tl.CostMicro != r.ChargedMicro {
		t.Fatalf("tally of the plain call %+v (found %v, %v), run %+v: want the call", tl, found, err, r)
	}
	if fps := clusterKeys(t, h, h.keys.Prefix+"dedup:{"+strconv.FormatUint(u.ID, 10)+"}:*"); len(fps) != 0 {
		t.Fatalf("fingerprints %v after the call ended: want none", fps)
	}
	// Its tally went in its own round trip, not in its fingerprint's transaction (across two
	// hash slots, which a Cluster may refuse: runstate.Tally.JoinsAdd): none failed and had to
	// be written again beside the settlement.
	if n := h.metric("tollgate_tally_failures_total"); n != "0" {
		t.Fatalf("%s tally writes failed for a plain call on a Cluster, want none", n)
	}

	// A named run: two calls, then its settlement.
	named := map[string]string{"X-Run-Id": "cluster-task", fakellm.HeaderChunks: "3"}
	var namedRun string
	for i := range 2 {
		resp := h.post(key, "/v1/chat/completions", chatBody+" ", named) // another body each: no duplicate
		readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("named run call %d: %d", i, resp.StatusCode)
		}
		namedRun = resp.Header.Get(proxy.RunIDHeader)
	}
	h.settled()
	if status, body := h.settleRun(key, "cluster-task"); status != http.StatusOK {
		t.Fatalf("settle the named run: %d %s", status, body)
	}
	nr := h.run(u.ID, namedRun)
	tl, found, err = h.tally.Get(ctx, namedRun)
	if err != nil || !found || tl.Calls != 2 || nr.ChargedMicro != tl.CostMicro || nr.ChargedMicro == 0 {
		t.Fatalf("named run %+v, tally %+v (found %v, %v): want both calls tallied and charged", nr, tl, found, err)
	}

	// A session's new message, on another gateway process, stops its running one: through the
	// cancel channel (PUBLISH on one node, the PSUBSCRIBE of the serving process maybe on another).
	second, other := h.secondGateway(nil, nil)
	req, _ := http.NewRequest(http.MethodPost, h.gw.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"tell me a long story"}]}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set(proxy.SessionHeader, "cluster-chat")
	req.Header.Set(fakellm.HeaderChunks, "2000")
	req.Header.Set(fakellm.HeaderChunkInterval, "5ms")
	long, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer long.Body.Close()
	oldRun := long.Header.Get(proxy.RunIDHeader)
	rd := afterContent(t, long, 3)
	sendOK(t, "the session's new message", other, key, chatBody, map[string]string{proxy.SessionHeader: "cluster-chat"})
	waitSettlements(t, second)
	rest, err := io.ReadAll(rd)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rest), `"code":"superseded"`) {
		t.Fatalf("the session's old stream did not end as superseded: ...%s", rest[max(0, len(rest)-300):])
	}
	h.settled()
	if old := h.run(u.ID, oldRun); old.SettleSource.String != holds.SourceCancel {
		t.Fatalf("the session's old run %+v: want settled by cancel", old)
	}

	// A Responses continuation reads its answers' records (one MGET of the user's keys, the
	// owner's record in a slot of its own, in one pipeline): its estimate counts the context,
	// and another user naming the answer is refused.
	firstID, handed := h.answerWithContext(u.ID, key, `{"model":"fake-gpt","conversation":"conv_c","input":"Read this long document."}`)
	next := `{"model":"fake-gpt","stream":true,"previous_response_id":"` + firstID + `","conversation":"conv_c","input":"Summarise it."}`
	cont := h.post(key, "/v1/responses", next, map[string]string{fakellm.HeaderChunks: "500", fakellm.HeaderChunkInterval: "20ms"})
	_, contRun := leaveAfterCreated(t, cont)
	h.settled()
	if r := h.run(u.ID, contRun); !r.Estimated || r.InTok < handed {
		t.Fatalf("continuation %+v: want an estimate counting the %d tokens handed on", r, handed)
	}
	_, otherKey := h.user("standard")
	h.postRefused(t, otherKey, "/v1/responses", next, nil, http.StatusBadRequest, "previous_response_not_found")

	// An Idempotency-Key request, then its replay.
	idem := map[string]string{proxy.IdempotencyKeyHeader: "cluster-key", fakellm.HeaderChunks: "2"}
	first := h.post(key, "/v1/chat/completions", chatBody, idem)
	firstBody := readAll(t, first.Body)
	first.Body.Close()
	h.settled()
	again := h.post(key, "/v1/chat/completions", chatBody, idem)
	againBody := readAll(t, again.Body)
	again.Body.Close()
	if first.StatusCode != http.StatusOK || again.StatusCode != http.StatusOK || again.Header.Get(proxy.ReplayedHeader) == "" ||
		string(againBody) != string(firstBody) {
		t.Fatalf("idempotent call %d, again %d (replayed %q): want the answer replayed", first.StatusCode, again.StatusCode,
			again.Header.Get(proxy.ReplayedHeader))
	}
}
