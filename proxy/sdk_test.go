package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestOpenAIGoClient points the real OpenAI Go client at the gateway: streamed and not, with
// and without include_usage. The client must see the upstream's answer (and a usage chunk
// only when it asked for one), and the charge must match the fake upstream's usage at the
// configured prices.
func TestOpenAIGoClient(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	const chunks = 17
	client := openai.NewClient(option.WithBaseURL(h.gw.URL+"/v1/"), option.WithAPIKey(key),
		option.WithHeader(fakellm.HeaderChunks, "17"), option.WithMaxRetries(0))
	prompt := "Write one line about exactly-once billing."
	params := openai.ChatCompletionNewParams{Model: "fake-gpt",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}}
	wantIn := fakellm.PromptTokens([]byte(`{"messages":[{"role":"user","content":"` + prompt + `"}]}`))

	check := func(t *testing.T, runID string) {
		t.Helper()
		run := h.run(u.ID, runID)
		if run.State != holds.StateSettled || run.InTok != wantIn || run.OutTok != chunks || run.Estimated {
			t.Fatalf("run = %+v, want settled with %d in / %d out", run, wantIn, chunks)
		}
		if want := fakeGPTCost(wantIn, chunks); run.ChargedMicro != want {
			t.Fatalf("charged %d, want %d", run.ChargedMicro, want)
		}
	}

	t.Run("non-streamed", func(t *testing.T) {
		var hdr = new(httpHeader)
		res, err := client.Chat.Completions.New(context.Background(), params, option.WithResponseInto(&hdr.resp))
		if err != nil {
			t.Fatal(err)
		}
		if res.Usage.PromptTokens != wantIn || res.Usage.CompletionTokens != chunks {
			t.Fatalf("client saw usage %+v", res.Usage)
		}
		if !strings.HasPrefix(res.Choices[0].Message.Content, "tok1 tok2") {
			t.Fatalf("client saw content %q", res.Choices[0].Message.Content)
		}
		check(t, hdr.resp.Header.Get(proxy.RunIDHeader))
	})

	for _, includeUsage := range []bool{false, true} {
		name := "streamed without include_usage"
		if includeUsage {
			name = "streamed with include_usage"
		}
		t.Run(name, func(t *testing.T) {
			p := params
			if includeUsage {
				p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
			}
			var hdr = new(httpHeader)
			stream := client.Chat.Completions.NewStreaming(context.Background(), p, option.WithResponseInto(&hdr.resp))
			var text strings.Builder
			var usageChunks int
			var acc openai.ChatCompletionAccumulator
			for stream.Next() {
				chunk := stream.Current()
				acc.AddChunk(chunk)
				if len(chunk.Choices) > 0 {
					text.WriteString(chunk.Choices[0].Delta.Content)
				}
				if chunk.JSON.Usage.Valid() && chunk.Usage.TotalTokens > 0 {
					usageChunks++
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(text.String(), "tok1 tok2") || !strings.HasSuffix(text.String(), "tok17 ") {
				t.Fatalf("client saw text %q", text.String())
			}
			if includeUsage && (usageChunks != 1 || acc.Usage.PromptTokens != wantIn || acc.Usage.CompletionTokens != chunks) {
				t.Fatalf("asked for usage: saw %d usage chunks, usage %+v", usageChunks, acc.Usage)
			}
			if !includeUsage && usageChunks != 0 {
				t.Fatalf("did not ask for usage but saw %d usage chunks", usageChunks)
			}
			check(t, hdr.resp.Header.Get(proxy.RunIDHeader))
		})
	}
}

// httpHeader captures the raw response the SDK received.
type httpHeader struct{ resp *http.Response }
