package proxy_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aopt "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tollgate/tollgate/proxy"
)

// dropFirstAnswer is the SDK's transport: it cuts the body of the first 2xx answer after
// dropFirstAnswerAt bytes, as a connection lost while the caller reads a whole answer the
// gateway has written and charged. It records each answer's run id and replay mark.
type dropFirstAnswer struct {
	mu      sync.Mutex
	dropped bool
	runs    []string
	replays []string
}

// dropFirstAnswerAt is how much of the first answer arrives: a few bytes of its JSON.
const dropFirstAnswerAt = 10

func (d *dropFirstAnswer) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.runs = append(d.runs, res.Header.Get(proxy.RunIDHeader))
	d.replays = append(d.replays, res.Header.Get(proxy.ReplayedHeader))
	if res.StatusCode/100 == 2 && !d.dropped {
		d.dropped = true
		res.Body = &droppedBody{rc: res.Body, left: dropFirstAnswerAt}
	}
	return res, nil
}

func (d *dropFirstAnswer) seen() (runs, replays []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.runs...), append([]string(nil), d.replays...)
}

// droppedBody gives left bytes of rc, then fails as a connection reset mid-body does.
type droppedBody struct {
	rc   io.ReadCloser
	left int
}

func (b *droppedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.ErrUnexpectedEOF
	}
	if len(p) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= n
	return n, err
}

func (b *droppedBody) Close() error { return b.rc.Close() }

// The Anthropic Go SDK sends a non-streamed call again when it cannot read its 200's body whole
// (anthropic-sdk-go's shouldRetryDroppedBody: a dropped body is a connection error, retried
// whatever the status). The first answer was whole at the gateway and charged, and its
// fingerprint given back: sent as a plain request, the resend runs, and the call is charged
// twice for the one answer the caller gets. Under an Idempotency-Key of its own the resend is
// the first answer replayed, charged once — the setting the README recommends for it.
func TestAnthropicSDKResendOfADroppedAnswerIsReplayedUnderItsKey(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		h := newHarness(t, nil)
		u, key := h.user("standard")
		d := &dropFirstAnswer{}
		c := anthropic.NewClient(aopt.WithBaseURL(h.gw.URL+"/"), aopt.WithAPIKey(key),
			aopt.WithHTTPClient(&http.Client{Transport: d}))
		var opts []aopt.RequestOption
		if keyed {
			opts = append(opts, aopt.WithHeader("Idempotency-Key", "call-1"))
		}
		m, err := c.Messages.New(context.Background(), aParams, opts...)
		if err != nil {
			t.Fatalf("keyed %v: %v", keyed, err)
		}
		runs, replays := d.seen()
		if len(runs) != 2 {
			t.Fatalf("keyed %v: the SDK made %d attempts (%v), want 2: the resend of the dropped answer", keyed, len(runs), runs)
		}
		if !keyed {
			// The behaviour the README warns of: two runs, each charged its answer.
			if n := h.fake.Calls(); n != 2 || runs[0] == runs[1] {
				t.Fatalf("unkeyed: %d upstream calls, runs %v; want the resend run again", n, runs)
			}
			h.expectCharges(u.ID, runs)
			continue
		}
		if n := h.fake.Calls(); n != 1 || runs[0] != runs[1] || replays[1] != "true" {
			t.Fatalf("keyed: %d upstream calls, runs %v, replays %v; want the resend answered by the first answer's replay", n, runs, replays)
		}
		charged := h.expectCharges(u.ID, runs[:1])
		if len(charged) != 1 || charged[0].ChargedMicro <= 0 || charged[0].InTok != m.Usage.InputTokens || charged[0].OutTok != m.Usage.OutputTokens {
			t.Fatalf("keyed: runs %+v, want one charged the usage the caller read, %+v", charged, m.Usage)
		}
	}
}

// The OpenAI Go SDK does not send a call again when it cannot read its 200's body (it reads the
// body after its retries): the caller gets the error, and the call was charged. Sent again by
// the caller under the same Idempotency-Key, it is the first answer replayed, not run again.
func TestOpenAISDKDroppedAnswerSentAgainUnderItsKeyIsReplayed(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	d := &dropFirstAnswer{}
	c := openai.NewClient(option.WithBaseURL(h.gw.URL+"/v1/"), option.WithAPIKey(key),
		option.WithHTTPClient(&http.Client{Transport: d}), option.WithHeader("Idempotency-Key", "call-1"))
	_, err := c.Chat.Completions.New(context.Background(), sdkParams)
	var apiErr *openai.Error
	if err == nil || errors.As(err, &apiErr) {
		t.Fatalf("first: %v, want the dropped body's read error", err)
	}
	if runs, _ := d.seen(); len(runs) != 1 {
		t.Fatalf("the SDK made %d attempts, want 1: it does not resend a dropped body", len(runs))
	}
	res, err := c.Chat.Completions.New(context.Background(), sdkParams)
	if err != nil {
		t.Fatal(err)
	}
	runs, replays := d.seen()
	if h.fake.Calls() != 1 || runs[0] != runs[1] || replays[1] != "true" {
		t.Fatalf("%d upstream calls, runs %v, replays %v; want the caller's resend replayed", h.fake.Calls(), runs, replays)
	}
	charged := h.expectCharges(u.ID, runs[:1])
	if charged[0].InTok != res.Usage.PromptTokens || charged[0].OutTok != res.Usage.CompletionTokens {
		t.Fatalf("charged %+v, want the usage the caller read, %+v", charged[0], res.Usage)
	}
}
