package proxy_test

import (
	"io"
	"net/http"
	"sync"
	"testing"
)

// TestGoogleSystemQueryParametersAreRefused: the caller's query string goes on to the upstream,
// and Google's front end reads system parameters in it on every API it serves, the Gemini
// OpenAI-compatible endpoint among them: `fields` (`$fields`), a field mask that can leave
// `usage` out of the answer (charged the estimate alone, thinking tokens unseen); `alt`
// (`$alt`), whose `proto` answers in protobuf, and `callback` (`$callback`), JSONP — text that
// is neither JSON nor an event stream, which the gateway charges nothing for while the
// provider billed the call. They are refused with 400 unsupported_parameter, before anything is
// held, as X-Goog-FieldMask is dropped, also behind a ';', which some servers split a query
// on; other query parameters (an API version) are served.
func TestGoogleSystemQueryParametersAreRefused(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	for _, q := range []string{"fields=choices", "%24fields=choices", "$fields=id", "alt=proto", "$alt=proto",
		"api-version=1&callback=f", "%24callback=f", "Fields=choices", "api-version=1;fields=choices"} {
		t.Run(q, func(t *testing.T) {
			h.postRefused(t, key, "/v1/chat/completions?"+q, chatBody, nil, http.StatusBadRequest, "unsupported_parameter")
		})
	}
	h.postOK(t, key, "/v1/chat/completions?api-version=2024-06-01", chatBody, nil) // an API version
}

// TestModelQueryParameterIsRefused: LiteLLM's proxy takes the model of its chat, completions
// and embeddings routes from a query parameter of its handler, `model` (there for its Azure-style
// deployment paths), in place of the body's: `POST /v1/chat/completions?model=o1-pro` with
// `"model": "fake-gpt"` in the body ran o1-pro, billed at its rates, while the gateway, which
// forwards the query string, priced, held and bounded the call as fake-gpt and charged it so
// (an answer naming an unpriced model is billed at the price asked for). It is refused with 400
// unsupported_parameter before anything is held, spelt any way a server could read it as
// `model`, on every route; a query without it is served.
func TestModelQueryParameterIsRefused(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", chatBody},
		{"/v1/completions", `{"model":"fake-gpt","prompt":"hi"}`},
		{"/v1/embeddings", `{"model":"fake-gpt","input":"hi"}`},
		{"/v1/responses", `{"model":"fake-gpt","input":"hi"}`},
	} {
		for _, q := range []string{"model=o1-pro", "%6Dodel=o1-pro", "Model=o1-pro", "api-version=1&model=o1-pro",
			"api-version=1;model=o1-pro", "model="} {
			t.Run(c.path+"?"+q, func(t *testing.T) {
				h.postRefused(t, key, c.path+"?"+q, c.body, nil, http.StatusBadRequest, "unsupported_parameter")
			})
		}
	}
	h.postOK(t, key, "/v1/chat/completions?models=1&api-version=2024-06-01", chatBody, nil) // no model in the query
}

// TestCallersQueryReachesTheUpstream: the query string a call is served with goes on to the
// upstream as the caller sent it: Azure OpenAI reads its API version there
// (`?api-version=2024-06-01`), and a call that lost it would be refused by the provider or
// answered by another version than the caller asked for.
func TestCallersQueryReachesTheUpstream(t *testing.T) {
	var mu sync.Mutex
	var query string
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		query = r.URL.RawQuery
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, plainAnswer)
	}, nil)
	_, key := h.user("standard")
	const sent = "api-version=2024-06-01&trace=on"
	h.postOK(t, key, "/v1/chat/completions?"+sent, chatBody, nil)
	mu.Lock()
	defer mu.Unlock()
	if query != sent {
		t.Errorf("the upstream was sent the query %q, want the caller's %q", query, sent)
	}
}
