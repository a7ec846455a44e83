package proxy

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/pricing"
)

// pathBody is a realistic request body for a route, for the benchmarks of what the gateway
// does with a body before forwarding it.
type pathBody struct {
	name string
	path string
	body []byte
}

// jsonStr is s as a JSON string.
func jsonStr(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// prose is n bytes of plain text with the odd character JSON escapes.
func prose(n int) string {
	const line = "The gateway holds credits before it forwards a call, and settles \"exactly once\".\n"
	return strings.Repeat(line, n/len(line)+1)[:n]
}

// toolSchemas is a tools array of n function tools, in the shape of fmt (chat, responses,
// anthropic).
func toolSchemas(shape string, n int) string {
	var b strings.Builder
	b.WriteString("[")
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		params := `{"type":"object","properties":{"path":{"type":"string","description":"A file path relative to the repository root."},"start":{"type":"integer"},"end":{"type":"integer"}},"required":["path"]}`
		name := `"tool_` + string(rune('a'+i)) + `"`
		switch shape {
		case "chat":
			b.WriteString(`{"type":"function","function":{"name":` + name + `,"description":"Reads part of a file.","parameters":` + params + `}}`)
		case "responses":
			b.WriteString(`{"type":"function","name":` + name + `,"description":"Reads part of a file.","parameters":` + params + `}`)
		default:
			b.WriteString(`{"name":` + name + `,"description":"Reads part of a file.","input_schema":` + params + `}`)
		}
	}
	b.WriteString("]")
	return b.String()
}

// agentTurns is an agent's transcript of about size bytes: tool calls and their results.
func agentTurns(shape string, size int) string {
	var b strings.Builder
	b.WriteString("[")
	switch shape {
	case "chat":
		b.WriteString(`{"role":"system","content":` + jsonStr(prose(4000)) + `},{"role":"user","content":"Fix the failing test."}`)
	case "responses":
		b.WriteString(`{"role":"user","content":[{"type":"input_text","text":"Fix the failing test."}]}`)
	default:
		b.WriteString(`{"role":"user","content":[{"type":"text","text":"Fix the failing test."}]}`)
	}
	for i := 0; b.Len() < size; i++ {
		id := `"call_` + strings.Repeat("x", 20) + string(rune('a'+i%26)) + `"`
		args := jsonStr(`{"path":"proxy/request.go","start":1,"end":200}`)
		out := jsonStr(prose(1800))
		switch shape {
		case "chat":
			b.WriteString(`,{"role":"assistant","content":null,"tool_calls":[{"id":` + id + `,"type":"function","function":{"name":"tool_a","arguments":` + args + `}}]}`)
			b.WriteString(`,{"role":"tool","tool_call_id":` + id + `,"content":` + out + `}`)
		case "responses":
			b.WriteString(`,{"type":"function_call","call_id":` + id + `,"name":"tool_a","arguments":` + args + `}`)
			b.WriteString(`,{"type":"function_call_output","call_id":` + id + `,"output":` + out + `}`)
		default:
			b.WriteString(`,{"role":"assistant","content":[{"type":"text","text":"Reading the file."},{"type":"tool_use","id":` + id + `,"name":"tool_a","input":{"path":"proxy/request.go","start":1,"end":200}}]}`)
			b.WriteString(`,{"role":"user","content":[{"type":"tool_result","tool_use_id":` + id + `,"content":` + out + `}]}`)
		}
	}
	b.WriteString("]")
	return b.String()
}

// requestPathBodies: a short chat, agent transcripts with many tool calls on every shape, and
// bodies carrying a base64 image of about 4 MB.
func requestPathBodies() []pathBody {
	image := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", 3<<20/16)))
	return []pathBody{
		{"chat_2KB", "/v1/chat/completions", []byte(`{"model":"fake-gpt","messages":[{"role":"system","content":"You are a helpful assistant."},` +
			`{"role":"user","content":` + jsonStr(prose(900)) + `},{"role":"assistant","content":` + jsonStr(prose(600)) + `},` +
			`{"role":"user","content":"And the second part?"}],"temperature":0.7,"stream":true,"max_tokens":100000}`)},
		{"chat_agent_200KB", "/v1/chat/completions", []byte(`{"model":"fake-gpt","messages":` + agentTurns("chat", 200<<10) +
			`,"tools":` + toolSchemas("chat", 12) + `,"tool_choice":"auto","stream":true,"max_completion_tokens":100000}`)},
		{"chat_image_4MB", "/v1/chat/completions", []byte(`{"model":"fake-gpt","messages":[{"role":"user","content":[{"type":"text","text":"What is in this picture?"},` +
			`{"type":"image_url","image_url":{"url":"data:image/png;base64,` + image + `","detail":"high"}}]}],"stream":true,"max_tokens":100000}`)},
		{"responses_agent_200KB", "/v1/responses", []byte(`{"model":"fake-gpt","instructions":` + jsonStr(prose(4000)) + `,"input":` + agentTurns("responses", 200<<10) +
			`,"tools":` + toolSchemas("responses", 12) + `,"stream":true,"max_output_tokens":100000}`)},
		{"anthropic_agent_200KB", anthropicPath, []byte(`{"model":"fake-claude","max_tokens":100000,"system":[{"type":"text","text":` + jsonStr(prose(4000)) +
			`,"cache_control":{"type":"ephemeral"}}],"messages":` + agentTurns("anthropic", 200<<10) + `,"tools":` + toolSchemas("anthropic", 12) +
			`,"thinking":{"type":"enabled","budget_tokens":60000},"stream":true}`)},
		{"anthropic_image_4MB", anthropicPath, []byte(`{"model":"fake-claude","max_tokens":100000,"messages":[{"role":"user","content":[` +
			`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + image + `"}},{"type":"text","text":"What is in this picture?"}]}]}`)},
	}
}

func routeFor(tb testing.TB, path string) *route {
	for _, rt := range routes {
		if rt.path == path {
			return rt
		}
	}
	tb.Fatalf("no route %s", path)
	return nil
}

// BenchmarkRequestPath is what a plain call's body goes through between its last byte read and
// the upstream request (readCall's parseCall and fingerprint hash, fitBudget's rewrite,
// upstreamRequest), without the network or the stores. The cap leaves room for a 5000-token
// answer, so the output bound (and Anthropic's thinking budget) is lowered as a call near its
// cap has it lowered.
func BenchmarkRequestPath(b *testing.B) {
	s := fuzzServer(b)
	hdr := http.Header{"Content-Type": {"application/json"}, "Authorization": {"Bearer tg_x"}}
	for _, pb := range requestPathBodies() {
		rt := routeFor(b, pb.path)
		b.Run(pb.name, func(b *testing.B) {
			c, aerr := s.parseCall(rt, pb.body, hdr)
			if aerr != nil {
				b.Fatalf("refused: %s", aerr.Message)
			}
			capMicro := c.boundPrice().Cost(pricing.Usage{Input: c.promptEstimate().Input, AudioInput: c.promptEstimate().AudioInput, Output: 5000})
			r := httptest.NewRequest(http.MethodPost, pb.path, nil)
			r.Header = hdr
			b.SetBytes(int64(len(pb.body)))
			b.ReportAllocs()
			for b.Loop() {
				c, aerr := s.parseCall(rt, pb.body, r.Header)
				if aerr != nil {
					b.Fatalf("refused: %s", aerr.Message)
				}
				_ = requestHash(rt.path+answerShaping(r), pb.body)
				if ok, err := c.rewrite(capMicro, s.cfg.Models[c.priceKey]); !ok || err != nil {
					b.Fatalf("rewrite: %v %v", ok, err)
				}
				if _, err := s.upstreamRequest(context.Background(), r, c.upstream, rt.path, c.body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
