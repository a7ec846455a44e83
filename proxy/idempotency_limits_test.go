package proxy_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestIdemRetryIsAnsweredWhateverTheLimits: DESIGN §6 — a retry with the same Idempotency-Key
// is answered from the key's record (409 request_in_progress while the first runs, its stored
// answer once it has finished), whatever the user's limits are by the time it comes: it runs
// nothing and holds nothing, so max_in_flight and the balance are not its to meet. Refused by
// them (429, 402), an SDK retrying a call whose answer it lost would never get the answer it
// was charged for. Each limit is checked to be in force on a call with no key meanwhile.
func TestIdemRetryIsAnsweredWhateverTheLimits(t *testing.T) {
	h, gate, _ := gatedObservedHarness(t, config.Upstream{Name: "gate-openai", Kind: "openai", Models: []string{"*"}})
	ctx := context.Background()
	zero, none := 0, int64(0)
	for _, limit := range []struct {
		name   string
		set    func(userID uint64) error
		status int
		code   string
	}{
		{"max_in_flight 0", func(id uint64) error { return h.store.SetUserLimits(ctx, id, nil, &zero, nil) },
			http.StatusTooManyRequests, "too_many_in_flight"},
		{"nothing available", func(id uint64) error { return h.store.SetUserLimits(ctx, id, &none, nil, nil) },
			http.StatusPaymentRequired, "insufficient_credits"},
	} {
		for _, stream := range []bool{false, true} {
			name := limit.name
			body := `{"model":"fake-gpt","messages":[{"role":"user","content":"Answer once, whatever comes after."}]}`
			if stream {
				name += ", stream"
				body = `{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"Answer once, whatever comes after."}]}`
			}
			t.Run(name, func(t *testing.T) {
				u, key := h.user("standard")
				idem := map[string]string{proxy.IdempotencyKeyHeader: "retry-me"}
				callsBefore := gate.fake.Calls()
				first := make(chan answer, 1)
				go func() { first <- send(h.gw.URL, key, body, with(idem, "X-Test-Gate", name)) }()
				gate.await(t, name, 1)
				if err := limit.set(u.ID); err != nil {
					t.Fatal(err)
				}

				// While the first runs: 409 request_in_progress, not the limit's refusal.
				inProgress := send(h.gw.URL, key, body, idem)
				if inProgress.err != nil {
					t.Fatal(inProgress.err)
				}
				if inProgress.status != http.StatusConflict || errorCode(t, inProgress.body) != "request_in_progress" {
					t.Errorf("retry while the first runs, %s: %d %s; want 409 request_in_progress", limit.name, inProgress.status, inProgress.body)
				}
				h.postRefused(t, key, "/v1/chat/completions", `{"model":"fake-gpt","messages":[{"role":"user","content":"another call"}]}`,
					nil, limit.status, limit.code)

				gate.open(name)
				a := <-first
				if a.err != nil || a.status != http.StatusOK {
					t.Fatalf("first: %d %v %s", a.status, a.err, a.body)
				}
				h.settled()
				before, err := testenv.BalanceAllDays(ctx, h.store, u.ID)
				if err != nil {
					t.Fatal(err)
				}

				// Once it has finished: its stored answer, byte for byte, still under the limit.
				replay := send(h.gw.URL, key, body, idem)
				if replay.err != nil {
					t.Fatal(replay.err)
				}
				if replay.status != http.StatusOK || replay.header.Get(proxy.ReplayedHeader) != "true" || !bytes.Equal(replay.body, a.body) {
					t.Errorf("retry once the first finished, %s: %d replayed=%q %.300s; want the first's answer replayed",
						limit.name, replay.status, replay.header.Get(proxy.ReplayedHeader), replay.body)
				}
				h.postRefused(t, key, "/v1/chat/completions", `{"model":"fake-gpt","messages":[{"role":"user","content":"one more call"}]}`,
					nil, limit.status, limit.code)

				if n := gate.fake.Calls() - callsBefore; n != 1 {
					t.Errorf("%d upstream calls, want 1", n)
				}
				h.expectCharges(u.ID, []string{a.header.Get(proxy.RunIDHeader)})
				after, err := testenv.BalanceAllDays(ctx, h.store, u.ID)
				if err != nil {
					t.Fatal(err)
				}
				// Across midnight UTC the day moves on; the figures, every day's row counted, do not.
				after.Day = before.Day
				if after != before {
					t.Errorf("the retries moved the balance: %+v, then %+v", before, after)
				}
			})
		}
	}
}
