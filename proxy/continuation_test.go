package proxy_test

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestContinuedResponseEstimatedWithItsContext: a Responses request that continues an earlier
// answer (previous_response_id) or a conversation carries their context on the provider's
// side, billed as input though the body holds only the new turn. A caller that leaves the
// stream before response.completed is charged an estimate, which must count that context as
// the earlier answer reported it: estimated from the body alone, the 50 000 tokens of
// context the provider billed were charged as nothing.
func TestContinuedResponseEstimatedWithItsContext(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	const reportedPrompt = 50_000
	for _, tc := range []struct{ name, first, next string }{
		{"previous_response_id", `{"model":"fake-gpt","input":"Read this long document."}`,
			`{"model":"fake-gpt","stream":true,"previous_response_id":"%s","input":"Summarise it."}`},
		{"conversation", `{"model":"fake-gpt","conversation":"conv_42","input":"Read this long document."}`,
			`{"model":"fake-gpt","stream":true,"conversation":{"id":"conv_42"},"input":"Summarise it."}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			firstID, handed := h.answerWithContext(u.ID, key, tc.first)
			next := strings.Replace(tc.next, "%s", firstID, 1)
			resp := h.post(key, "/v1/responses", next, map[string]string{fakellm.HeaderChunks: "500", fakellm.HeaderChunkInterval: "20ms"})
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("next: %d %s", resp.StatusCode, readAll(t, resp.Body))
			}
			runID := resp.Header.Get(proxy.RunIDHeader)
			rd := bufio.NewReader(resp.Body)
			for range 3 {
				if _, err := rd.ReadString('\n'); err != nil {
					t.Fatal(err)
				}
			}
			resp.Body.Close() // the caller leaves before response.completed
			run := h.run(u.ID, runID)
			if run.SettleSource.String != holds.SourceCancel || !run.Estimated {
				t.Fatalf("run %+v, want an estimated cancel", run)
			}
			if run.InTok < handed {
				t.Fatalf("estimated in_tok %d, want at least the %d tokens of context the first answer handed on", run.InTok, handed)
			}

			// Another user naming the same answer is refused (TestAnotherUsersAnswerIsNotContinued);
			// naming the same conversation, continues nothing of theirs.
			if tc.name == "previous_response_id" {
				return
			}
			other, otherKey := h.user("standard")
			resp = h.post(otherKey, "/v1/responses", next, map[string]string{fakellm.HeaderChunks: "500", fakellm.HeaderChunkInterval: "20ms"})
			runID = resp.Header.Get(proxy.RunIDHeader)
			if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if run := h.run(other.ID, runID); run.InTok >= reportedPrompt {
				t.Fatalf("another user's estimate took the first user's context: in_tok %d", run.InTok)
			}
		})
	}
}

// leaveAfterCreated reads a Responses stream up to its response.in_progress event (so the
// gateway has forwarded response.created, with the answer's id) and leaves. It returns the
// answer's id and its run id.
func leaveAfterCreated(t *testing.T, resp *http.Response) (respID, runID string) {
	t.Helper()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, readAll(t, resp.Body))
	}
	runID = resp.Header.Get(proxy.RunIDHeader)
	rd := bufio.NewReader(resp.Body)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			if id := gjson.Get(data, "response.id").Str; id != "" && respID == "" {
				respID = id
			}
			if gjson.Get(data, "type").Str == "response.in_progress" {
				break
			}
		}
	}
	resp.Body.Close()
	return respID, runID
}

// TestContinuedResponseToolsNotCountedTwice: previous_response_id carries an answer's input
// and output items, not its request's instructions and tools, which a continuation sends
// again (and its estimate counts from its body). The answer's reported prompt counts them, so
// recorded whole as the context it hands on, a continuation cut before its usage was charged
// its tools twice (and its output bound reckoned them twice: 402 or a lowered
// max_output_tokens for an agent with a large tool set).
func TestContinuedResponseToolsNotCountedTwice(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	tools := `[{"type":"function","name":"lookup","description":"` + strings.Repeat("a", 40_000) +
		`","parameters":{"type":"object","properties":{}}}]`
	const toolTokens = 10_000 // 40 000 bytes at four a token
	first := `{"model":"fake-gpt","instructions":"Be brief.","tools":` + tools + `,"input":"Read this long document."}`
	firstID, handed := h.answerWithContext(u.ID, key, first)

	next := `{"model":"fake-gpt","stream":true,"instructions":"Be brief.","tools":` + tools +
		`,"previous_response_id":"` + firstID + `","input":"Summarise it."}`
	_, runID := leaveAfterCreated(t, h.post(key, "/v1/responses", next,
		map[string]string{fakellm.HeaderChunks: "500", fakellm.HeaderChunkInterval: "20ms"}))
	run := h.run(u.ID, runID)
	if !run.Estimated {
		t.Fatalf("run %+v, want an estimate", run)
	}
	// The provider bills the first answer's context less its tools, plus the tools sent again
	// and the new turn: about what the first answer handed on.
	if run.InTok >= handed+toolTokens/2 {
		t.Fatalf("estimated in_tok %d: the %d tokens of context handed on and the %d of tools counted twice", run.InTok, handed, toolTokens)
	}
	if run.InTok < handed-toolTokens/2 {
		t.Fatalf("estimated in_tok %d, want about the %d tokens of context handed on", run.InTok, handed)
	}
}

// TestContinuedResponseChainOfCutAnswers: a caller that leaves every stream before
// response.completed gets no answer recorded with a usage report; the provider still bills
// each continuation the context it carries. Recording only reported answers, the third call
// of such a chain was estimated from its new turn alone: the 50 000 tokens of context the
// first answer handed on were charged once and then never again.
func TestContinuedResponseChainOfCutAnswers(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	prev, handed := h.answerWithContext(u.ID, key, `{"model":"fake-gpt","input":"Read this long document."}`)
	slow := map[string]string{fakellm.HeaderChunks: "500", fakellm.HeaderChunkInterval: "20ms"}
	for i, turn := range []string{"Summarise it.", "Shorter."} {
		id, runID := leaveAfterCreated(t, h.post(key, "/v1/responses",
			`{"model":"fake-gpt","stream":true,"previous_response_id":"`+prev+`","input":"`+turn+`"}`, slow))
		run := h.run(u.ID, runID)
		if !run.Estimated {
			t.Fatalf("call %d: run %+v, want an estimate", i+2, run)
		}
		if run.InTok < handed {
			t.Fatalf("call %d: estimated in_tok %d, want at least the %d tokens of context the chain carries", i+2, run.InTok, handed)
		}
		if id == "" {
			t.Fatalf("call %d: no response id seen", i+2)
		}
		prev = id
	}
}

// TestContinuedConversationIDNotRepeated: the gateway reads the first of repeated keys, a
// provider the last. A conversation object naming its id twice looked up a conversation the
// gateway recorded nothing for while the provider carried another's context: the estimate
// without it, at the caller's choice.
func TestContinuedConversationIDNotRepeated(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	resp := h.post(key, "/v1/responses",
		`{"model":"fake-gpt","stream":true,"conversation":{"id":"conv_none","id":"conv_42"},"input":"Summarise it."}`, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || errorCode(t, body) != "invalid_json" {
		t.Fatalf("%d %s, want 400 invalid_json", resp.StatusCode, body)
	}
}

// answerWithContext sends a Responses call whose answer reports a 50 000-token prompt and
// returns the answer's id and the context it hands on as its settled row records it (prompt
// and output).
func (h *harness) answerWithContext(userID uint64, key, body string) (id string, handed int64) {
	h.t.Helper()
	// An answer of 200 tokens: more than a new turn's own estimate, so that a context handed
	// on without its output shows.
	run, answer := h.answeredRun(userID, key, "/v1/responses", body, map[string]string{fakellm.HeaderPromptTokens: "50000", fakellm.HeaderChunks: "200"})
	if run.InTok < 50_000 {
		h.t.Fatalf("first answer in_tok %d, want the 50 000 reported", run.InTok)
	}
	return gjson.GetBytes(answer, "id").Str, run.InTok + run.CacheReadTok + run.CacheWriteTok + run.OutTok
}

// TestAnotherUsersAnswerIsNotContinued: every caller's Responses answers are stored at the
// provider under the operator's one account, so a previous_response_id made for user A, sent
// by user B, had the provider continue A's conversation — A's prompts and answers — for B (and
// B's estimate took none of A's context). Refused as the provider refuses an id it does not
// know (400 previous_response_not_found), before anything is held or forwarded; A continues
// it as before, and an id the gateway has no record of is forwarded.
func TestAnotherUsersAnswerIsNotContinued(t *testing.T) {
	h := newHarness(t, nil)
	a, aKey := h.user("standard")
	firstID, _ := h.answerWithContext(a.ID, aKey, `{"model":"fake-gpt","input":"My private notes."}`)
	next := `{"model":"fake-gpt","previous_response_id":"` + firstID + `","input":"What did I write?"}`

	_, bKey := h.user("standard")
	h.postRefused(t, bKey, "/v1/responses", next, nil, http.StatusBadRequest, "previous_response_not_found")

	h.postOK(t, aKey, "/v1/responses", next, nil) // the owner's continuation
	unknown := `{"model":"fake-gpt","previous_response_id":"resp_made_elsewhere","input":"Go on."}`
	h.postOK(t, bKey, "/v1/responses", unknown, nil) // an id without a record
}

// TestContinuedResponseCarriesItsCachedContext: the context an answer hands on is its whole
// prompt as reported — the cached part too, which the provider bills again (at the cache-read
// price) when a continuation carries it — and its output. A continuation the caller leaves is
// estimated with all of it: counted without the cached part, a prompt served mostly from the
// cache was carried on as a fraction of itself.
func TestContinuedResponseCarriesItsCachedContext(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	first, answer := h.answeredRun(u.ID, key, "/v1/responses", `{"model":"fake-gpt","stream":true,"input":"Read this long document."}`,
		map[string]string{fakellm.HeaderReplay: "openai_responses_stream_cached_tokens.sse"})
	if first.CacheReadTok == 0 {
		t.Fatalf("first answer %+v: want the fixture's cached tokens", first)
	}
	var firstID string
	for _, line := range strings.Split(string(answer), "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok && firstID == "" {
			firstID = gjson.Get(data, "response.id").Str
		}
	}
	handed := first.InTok + first.CacheReadTok + first.OutTok
	resp := h.post(key, "/v1/responses", `{"model":"fake-gpt","stream":true,"previous_response_id":"`+firstID+`","input":"Go on."}`,
		map[string]string{fakellm.HeaderChunks: "500", fakellm.HeaderChunkInterval: "20ms"})
	_, runID := leaveAfterCreated(t, resp)
	if run := h.run(u.ID, runID); !run.Estimated || run.InTok < handed {
		t.Fatalf("continuation %+v: want estimated in_tok of at least the %d tokens handed on (%d cached)", run, handed, first.CacheReadTok)
	}
}

// TestContinuedReasoningAnswerChargedItsReport: the context a reasoning answer hands on counts
// its reasoning tokens (part of output_tokens), which the provider carries into a
// continuation's context in a tool loop and, for models that keep every turn's reasoning
// (reasoning.context all_turns), after a new user turn too; older models drop it there. The
// figure is a part of the continuation's estimate only: a continuation whose usage comes is
// charged the provider's count, whatever was carried, and only one settled without a usage
// report (its caller left before response.completed) is charged the estimate with it.
func TestContinuedReasoningAnswerChargedItsReport(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	first, answer := h.answeredRun(u.ID, key, "/v1/responses", `{"model":"fake-gpt","stream":true,"input":"Think hard."}`,
		map[string]string{fakellm.HeaderReplay: "openai_responses_stream_usage_reasoning.sse"})
	var firstID string
	for _, line := range strings.Split(string(answer), "\n") {
		if d, ok := strings.CutPrefix(line, "data: "); ok && firstID == "" {
			firstID = gjson.Get(d, "response.id").Str
		}
	}
	handed := first.InTok + first.OutTok // 53 + 469, of which 448 reasoning
	next := `{"model":"fake-gpt","previous_response_id":"` + firstID + `","input":"Go on."}`
	run, _ := h.answeredRun(u.ID, key, "/v1/responses", next, map[string]string{fakellm.HeaderPromptTokens: "700"})
	if run.Estimated || run.InTok != 700 {
		t.Fatalf("completed continuation %+v: want the reported 700 input tokens, nothing carried added", run)
	}
	_, runID := leaveAfterCreated(t, h.post(key, "/v1/responses", strings.Replace(next, `"input"`, `"stream":true,"input"`, 1),
		map[string]string{fakellm.HeaderChunks: "500", fakellm.HeaderChunkInterval: "20ms"}))
	if cut := h.run(u.ID, runID); !cut.Estimated || cut.InTok < handed {
		t.Fatalf("cut continuation %+v: want an estimate of at least the %d tokens handed on", cut, handed)
	}
}

// TestAnotherUsersAnswerItemIsNotReferenced: a Responses request may name an item of an earlier
// answer by its id instead of sending it ({"type":"item_reference","id":…}, or the item sent
// back with its id), and the provider fetches that item from what it stores — every caller's
// answers, under the operator's one account. User A's answer's message, named by user B, had
// the provider put A's answer in B's prompt: refused as the provider refuses an id it does not
// know, before anything is held or forwarded, in a stream's answer as in a whole one. A names
// its own items as before, and an id the gateway has no record of is forwarded.
func TestAnotherUsersAnswerItemIsNotReferenced(t *testing.T) {
	h := newHarness(t, nil)
	a, aKey := h.user("standard")
	_, whole := h.answeredRun(a.ID, aKey, "/v1/responses", `{"model":"fake-gpt","input":"My private notes."}`, nil)
	itemID := gjson.GetBytes(whole, "output.0.id").Str
	_, streamed := h.answeredRun(a.ID, aKey, "/v1/responses", `{"model":"fake-gpt","stream":true,"input":"My other notes."}`, nil)
	var streamedID string
	for _, line := range strings.Split(string(streamed), "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok && gjson.Get(data, "type").Str == "response.output_item.added" {
			streamedID = gjson.Get(data, "item.id").Str
		}
	}
	if itemID == "" || streamedID == "" || itemID == streamedID {
		t.Fatalf("answers' item ids %q and %q; want two", itemID, streamedID)
	}

	_, bKey := h.user("standard")
	for _, input := range []string{
		`[{"type":"item_reference","id":"` + itemID + `"},{"role":"user","content":"Repeat that."}]`,
		`[{"id":"` + streamedID + `"},{"role":"user","content":"Repeat that."}]`,
		`[{"type":"message","id":"` + itemID + `","role":"assistant","content":[{"type":"output_text","text":"x"}]},{"role":"user","content":"Go on."}]`,
		`[{"type":"item_reference","ID":"` + itemID + `"},{"role":"user","content":"Repeat that."}]`,
	} {
		h.postRefused(t, bKey, "/v1/responses", `{"model":"fake-gpt","input":`+input+`}`, nil, http.StatusNotFound, "item_not_found")
	}

	own := `{"model":"fake-gpt","input":[{"type":"item_reference","id":"` + itemID + `"},{"type":"item_reference","id":"` + streamedID + `"},{"role":"user","content":"Repeat that."}]}`
	h.postOK(t, aKey, "/v1/responses", own, nil) // the owner's reference to its own items
	// Every id is checked, or refused when there are too many to check: past the bound,
	// another user's item would go unchecked.
	var many strings.Builder
	for i := range 4097 {
		many.WriteString(`{"type":"item_reference","id":"msg_` + strconv.Itoa(i) + `"},`)
	}
	h.postRefused(t, bKey, "/v1/responses", `{"model":"fake-gpt","input":[`+many.String()+`{"role":"user","content":"Go on."}]}`,
		nil, http.StatusBadRequest, "too_many_item_ids")

	unknown := `{"model":"fake-gpt","input":[{"type":"item_reference","id":"msg_made_elsewhere"},{"role":"user","content":"Go on."}]}`
	h.postOK(t, bKey, "/v1/responses", unknown, nil) // an id without a record
}
