package proxy_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestPanicAfterTheAnswerBeganCutsTheConnection: a call that panics once its answer began (its
// 200 and some of its stream sent) is cut, its connection closed, as any stream cut is: the
// caller sees a broken answer, never resent by the SDKs once its 200 came. It is not answered
// the 500 of a call that panicked before its answer began: written over a started stream, that
// error would end it as though whole, an error object appended to its events.
func TestPanicAfterTheAnswerBeganCutsTheConnection(t *testing.T) {
	inner := &http.Transport{}
	t.Cleanup(inner.CloseIdleConnections)
	h := newHarnessOn(t, harnessSetup{transport: midAnswerPanicTransport{inner: inner}}, nil)
	_, key := h.user("standard")
	req, _ := http.NewRequest(http.MethodPost, h.gw.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"Say hello to the billing team, please."}]}`))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%v, want the answer begun: a 200 before the panic", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || err == nil || strings.Contains(string(body), "internal_error") {
		t.Errorf("answered %d, read ending %v, body %q; want a 200 cut (a read error), no error object written over it",
			resp.StatusCode, err, body)
	}
	h.settled()
}

// midAnswerPanicTransport hands on inner's answer, whose body panics on its second read, the first
// a piece of its stream: the answer has begun by then (its headers relayed).
type midAnswerPanicTransport struct{ inner http.RoundTripper }

func (p midAnswerPanicTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := p.inner.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	resp.Body = &panicOnSecondRead{ReadCloser: resp.Body}
	return resp, nil
}

type panicOnSecondRead struct {
	io.ReadCloser
	reads int
}

func (r *panicOnSecondRead) Read(b []byte) (int, error) {
	if r.reads++; r.reads > 1 {
		panic("test: panic while the answer is relayed")
	}
	return r.ReadCloser.Read(b[:min(len(b), 64)]) // a piece of the first event: more reads to come
}
