package proxy_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// TestSequentialIdenticalRequestsRun: a script asks the same question again as soon as it
// has the first answer (README: "a repeat after it finished: runs"). No repeat may be told
// 409 duplicate.
func TestSequentialIdenticalRequestsRun(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Plans["standard"] = bigPlan(c.Plans["standard"]) })
	_, key := h.user("standard")
	clients := []*http.Client{{Transport: &http.Transport{}}, {Transport: &http.Transport{}}}
	body := chatBody
	do := func(cl *http.Client) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, h.gw.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	refused := 0
	for i := range 120 {
		if i == 60 {
			body = `{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"Say hello."}]}`
		}
		st, b := do(clients[i%2])
		if st != 200 {
			refused++
			t.Logf("request %d: %d %s", i, st, b)
		}
	}
	if refused > 0 {
		t.Fatalf("%d of 120 sequential requests refused although the previous one had answered", refused)
	}
}

// TestSessionRegenerateAfterAnswerRuns: a chat UI's "regenerate" resends the session's
// last message once its answer is in (README: same message, a repeat after it finished: runs).
func TestSessionRegenerateAfterAnswerRuns(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Plans["standard"] = bigPlan(c.Plans["standard"]) })
	_, key := h.user("standard")
	clients := []*http.Client{{Transport: &http.Transport{}}, {Transport: &http.Transport{}}}
	refused := 0
	for i := range 60 {
		req, _ := http.NewRequest(http.MethodPost, h.gw.URL+"/v1/chat/completions", strings.NewReader(chatBody))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Session-Id", "chat-1")
		resp, err := clients[i%2].Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			refused++
			t.Logf("request %d: %d %s", i, resp.StatusCode, b)
		}
	}
	if refused > 0 {
		t.Fatalf("%d of 60 regenerations refused although the previous answer was in", refused)
	}
}

// TestSupersededCallIsNotRetriedBySDK: an SDK whose call is superseded by a newer message
// of its session must not retry it (OpenAI SDKs retry every 409 unless X-Should-Retry: false):
// the retry would resend the old message and supersede the newer one.
//
// The old call stays with the upstream (at its gate) until the newer message is answered: it
// is cancelled there when superseded. (Held a fixed 1.5 s instead, it could end before a slow
// machine's newer message arrived, and succeed.)
func TestSupersededCallIsNotRetriedBySDK(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	_, key := h.user("standard")
	client := openai.NewClient(option.WithBaseURL(h.gw.URL+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(2),
		option.WithHeader("X-Session-Id", "chat-sdk"), option.WithHeader("X-Test-Gate", "old"))
	params := openai.ChatCompletionNewParams{Model: "fake-gpt",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("the old question")}}
	olderr := make(chan error, 1)
	go func() {
		_, err := client.Chat.Completions.New(context.Background(), params)
		olderr <- err
	}()
	gate.await(t, "old", 1)
	b := send(h.gw.URL, key, chatBody, map[string]string{"X-Session-Id": "chat-sdk"})
	gate.open("old") // a call of the old message not cancelled (or retried) goes on to its answer
	if b.status != 200 {
		t.Errorf("the newer message: %d %s", b.status, b.body)
	}
	if err := <-olderr; err == nil {
		t.Errorf("the superseded call succeeded")
	}
	if n := len(gate.gate("old").arrived); n != 0 {
		t.Errorf("the superseded call reached the upstream %d more times (retried by its SDK)", n)
	}
}

// TestIdempotentRetryAfterRedisLostTheRecord: the key's request ran and was charged; Redis
// then lost the record (a restart without persistence, a failover). A retry with the key must
// not run and be charged a second time: the settled hold of the key's run is in MySQL.
func TestIdempotentRetryAfterRedisLostTheRecord(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	idem := map[string]string{"Idempotency-Key": "redis-restart"}
	a := sendOK(t, "first", h.gw.URL, key, chatBody, idem)
	h.settled()
	ctx := context.Background()
	recs, _ := h.rdb.Keys(ctx, h.keys.Prefix+"replay:*").Result()
	if err := h.rdb.Del(ctx, recs...).Err(); err != nil {
		t.Fatal(err)
	}
	b := send(h.gw.URL, key, chatBody, idem)
	h.settled()
	t.Logf("retry: %d %s", b.status, b.body)
	if n := h.fake.Calls(); n != 1 {
		var charged int
		_ = h.db.Get(&charged, "SELECT COUNT(*) FROM run_holds WHERE user_id = ? AND charged_micro > 0", u.ID)
		t.Fatalf("%d upstream calls and %d charged runs for one Idempotency-Key", n, charged)
	}
	// Not charged a second time either: the first run is the user's one charge, and the retry
	// holds nothing it keeps. (The upstream's count alone let a retry that was admitted and
	// charged its hold, never forwarded, pass.)
	h.expectCharges(u.ID, []string{a.header.Get(proxy.RunIDHeader)})
}
