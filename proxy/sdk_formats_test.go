package proxy_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestAnthropicGoClientStreamsThroughMessages streams with the real Anthropic Go client over
// /v1/messages (x-api-key auth): the run is charged the usage the client was told.
func TestAnthropicGoClientStreamsThroughMessages(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	var raw *http.Response
	client := anthropic.NewClient(anthropicoption.WithBaseURL(h.gw.URL+"/"), anthropicoption.WithAPIKey(key),
		anthropicoption.WithHeader(fakellm.HeaderChunks, "9"), anthropicoption.WithMaxRetries(0))
	stream := client.Messages.NewStreaming(context.Background(), anthropic.MessageNewParams{
		Model: "claude-test", MaxTokens: 256,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Describe a toll gate."))},
	}, anthropicoption.WithResponseInto(&raw))
	var msg anthropic.Message
	for stream.Next() {
		if err := msg.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if msg.Usage.OutputTokens != 9 || msg.Usage.InputTokens == 0 || len(msg.Content) == 0 {
		t.Fatalf("client saw %+v", msg)
	}
	run := h.run(u.ID, raw.Header.Get(proxy.RunIDHeader))
	if run.State != holds.StateSettled || run.Estimated || run.InTok != msg.Usage.InputTokens || run.OutTok != msg.Usage.OutputTokens {
		t.Fatalf("run = %+v, want the client's usage %+v", run, msg.Usage)
	}
	if want := fakeGPTCost(run.InTok, run.OutTok); run.ChargedMicro != want {
		t.Fatalf("charged %d, want %d", run.ChargedMicro, want)
	}
}

// TestOpenAIGoClientStreamsThroughResponses streams with the OpenAI Go client over
// /v1/responses, whose usage arrives in response.completed and which has no [DONE].
func TestOpenAIGoClientStreamsThroughResponses(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	var raw *http.Response
	client := openai.NewClient(option.WithBaseURL(h.gw.URL+"/v1/"), option.WithAPIKey(key),
		option.WithHeader(fakellm.HeaderChunks, "11"), option.WithMaxRetries(0))
	stream := client.Responses.NewStreaming(context.Background(), responses.ResponseNewParams{
		Model: "fake-gpt", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Describe a toll gate.")},
	}, option.WithResponseInto(&raw))
	var usage responses.ResponseUsage
	completed := 0
	for stream.Next() {
		ev := stream.Current()
		if ev.Type == "response.completed" {
			usage = ev.AsResponseCompleted().Response.Usage
			completed++
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if completed != 1 || usage.OutputTokens != 11 || usage.InputTokens == 0 {
		t.Fatalf("client saw %d completions, usage %+v", completed, usage)
	}
	run := h.run(u.ID, raw.Header.Get(proxy.RunIDHeader))
	if run.State != holds.StateSettled || run.Estimated || run.InTok != usage.InputTokens || run.OutTok != usage.OutputTokens {
		t.Fatalf("run = %+v, want the client's usage %+v", run, usage)
	}
	if want := fakeGPTCost(run.InTok, run.OutTok); run.ChargedMicro != want {
		t.Fatalf("charged %d, want %d", run.ChargedMicro, want)
	}
}
