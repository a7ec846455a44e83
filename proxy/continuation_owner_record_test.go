package proxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tidwall/gjson"
)

// responsesUpstream answers every Responses call whole under the answer id *id holds.
func responsesUpstream(id *atomic.Pointer[string]) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%q,"object":"response","status":"completed","output":[{"type":"message","id":"msg_out","role":"assistant",`+
			`"content":[{"type":"output_text","text":"Noted."}]}],"usage":{"input_tokens":10,"output_tokens":5,"total_tokens":15}}`, *id.Load())
	}
}

// TestAnswerOfTheLongestLookedUpIDHasItsOwner: an answer id as long as the longest the gateway
// looks up (256 bytes) is recorded as its user's, as a shorter one is: another user naming it
// in previous_response_id is refused. Recorded only below the bound, such an id went unowned
// and was forwarded, and the provider continued the first user's conversation for the other.
func TestAnswerOfTheLongestLookedUpIDHasItsOwner(t *testing.T) {
	var id atomic.Pointer[string]
	longest := "resp_" + strings.Repeat("a", 256-len("resp_"))
	id.Store(&longest)
	h := hostileHarness(t, responsesUpstream(&id), nil)
	a, aKey := h.user("standard")
	h.answeredRun(a.ID, aKey, "/v1/responses", `{"model":"fake-gpt","input":"My private notes."}`, nil)

	_, bKey := h.user("standard")
	h.postRefused(t, bKey, "/v1/responses", `{"model":"fake-gpt","previous_response_id":"`+longest+`","input":"What did they write?"}`,
		nil, http.StatusBadRequest, "previous_response_not_found")
}

// TestAnswerOwnerIsTheFirstToRecordIt: an answer id is its first caller's. An upstream that
// answers another user under the same id (a proxy in front of it replaying an answer, a
// provider's fault) does not hand the first user's conversation to the second: recorded over,
// the id became the second user's, who could then continue it, and the first was refused it.
func TestAnswerOwnerIsTheFirstToRecordIt(t *testing.T) {
	var id atomic.Pointer[string]
	shared := "resp_shared"
	id.Store(&shared)
	h := hostileHarness(t, responsesUpstream(&id), nil)
	a, aKey := h.user("standard")
	b, bKey := h.user("standard")
	h.answeredRun(a.ID, aKey, "/v1/responses", `{"model":"fake-gpt","input":"My private notes."}`, nil)
	h.answeredRun(b.ID, bKey, "/v1/responses", `{"model":"fake-gpt","input":"Hello."}`, nil)

	next := `{"model":"fake-gpt","previous_response_id":"resp_shared","input":"What was written?"}`
	h.postRefused(t, bKey, "/v1/responses", next, nil, http.StatusBadRequest, "previous_response_not_found")
	h.postOK(t, aKey, "/v1/responses", next, nil) // the first owner's continuation
}

// TestForeignItemRefusalNamesThatItem: a request naming several items, one of them another
// user's, is refused naming that item, as the provider names the id it does not know; named
// the first of them (an id the gateway has no record of, or the caller's own), the refusal
// pointed the caller at an item that is there.
func TestForeignItemRefusalNamesThatItem(t *testing.T) {
	h := newHarness(t, nil)
	a, aKey := h.user("standard")
	_, whole := h.answeredRun(a.ID, aKey, "/v1/responses", `{"model":"fake-gpt","input":"My private notes."}`, nil)
	theirs := gjson.GetBytes(whole, "output.0.id").Str
	if theirs == "" {
		t.Fatalf("answer %s names no output item", whole)
	}
	_, bKey := h.user("standard")
	resp := h.post(bKey, "/v1/responses", `{"model":"fake-gpt","input":[{"type":"item_reference","id":"msg_made_elsewhere"},`+
		`{"type":"item_reference","id":"`+theirs+`"},{"role":"user","content":"Go on."}]}`, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || errorCode(t, body) != "item_not_found" {
		t.Fatalf("%d %s, want 404 item_not_found", resp.StatusCode, body)
	}
	if msg := errorMessage(t, body); !strings.Contains(msg, "'"+theirs+"'") {
		t.Fatalf("refusal %q does not name the other user's item %s", msg, theirs)
	}
}
