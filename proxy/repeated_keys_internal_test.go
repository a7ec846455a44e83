package proxy

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/metering"
)

// repeatedKeyAnywhere finds an exact repeat (compared unescaped) in any object at any depth,
// whatever strings, arrays and other objects lie between, and nothing else.
func TestRepeatedKeyAnywhere(t *testing.T) {
	many := func(extra string) string {
		var b strings.Builder
		b.WriteString(`{"a":{`)
		for i := range 40 {
			fmt.Fprintf(&b, `"k%d":%d,`, i, i)
		}
		b.WriteString(extra + `"end":1}}`)
		return b.String()
	}
	cases := []struct {
		body, want string
		found      bool
	}{
		{`{"a":1,"b":{"a":1},"c":[{"a":1},{"a":2}]}`, "", false},
		{`{"a":"x\"y{\"a\":1,\"a\":2}","b":"}"}`, "", false}, // repeats inside a string are text
		{`{"m":[{"role":"user","content":"hi","content":"long"}]}`, "m[].content", true},
		{`{"m":[[{"x":{"t":1,"t":2}}]]}`, "m[][].x.t", true},
		{`{"a":{"b":1},"c":{"d":1,"\u0064":2}}`, "c.d", true}, // escaped: the same key to a provider
		{`{"a":{"k":1,"K":2}}`, "", false},                    // case variants: repeatedPromptKey's business
		{many(""), "", false},
		{many(`"k3":0,`), "a.k3", true}, // past keysBeforeSet
		{many(`"k39":0,`), "a.k39", true},
		{many(`"k0":0,`), "a.k0", true},                          // the first key, kept in the set built past keysBeforeSet
		{`{"m":["a","b","b"],"n":[1,"x",{"y":"x"}]}`, "", false}, // an array's repeated strings are values, not keys
		{`{"":0,"":1,"model":"a","model":"b"}`, "", true},        // the top level's empty key, repeated
		{`{"":0,"a":{"":1,"":2}}`, "a.", true},
	}
	for _, tc := range cases {
		if !gjson.Valid(tc.body) {
			t.Fatalf("test body is not JSON: %s", tc.body)
		}
		if got, found := repeatedKeyAnywhere(tc.body); got != tc.want || found != tc.found {
			t.Errorf("repeatedKeyAnywhere(%.80s) = %q, %v, want %q, %v", tc.body, got, found, tc.want, tc.found)
		}
	}
}

// repeatedPromptKey compares the keys of the objects the prompt's estimate reads with case
// folded, and no others (a tool schema or a tool call's input may hold "ID" beside "id").
func TestRepeatedPromptKey(t *testing.T) {
	cases := []struct {
		f          metering.Format
		body, want string
	}{
		{metering.FormatChat, `{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b","Content":"long"}]}`, "messages[1].Content"},
		// A message of more keys than are compared as they come (keysBeforeSet): its keys are
		// compared once it has been read, sorted with case folded, first and last alike.
		{metering.FormatChat, `{"messages":[{"role":"user","content":"a",` + wideKeys(40) + `"CONTENT":"long"}]}`, "messages[0].CONTENT"},
		{metering.FormatChat, `{"messages":[{"role":"user","content":"a",` + wideKeys(40) + `"K39":"x"}]}`, "messages[0].K39"},
		{metering.FormatChat, `{"messages":[{"role":"user","content":"a",` + wideKeys(40) + `"\u212a0":"x"}]}`, "messages[0].\u212a0"},
		{metering.FormatChat, `{"messages":[{"role":"user","content":"a",` + wideKeys(40) + `"end":"x"}]}`, ""},
		{metering.FormatChat, `{"messages":[{"role":"user","Content":"long"}]}`, "messages[0].Content"},
		{metering.FormatChat, `{"messages":[{"role":"user","content":[{"type":"text","text":"a","TEXT":"long"}]}]}`, "messages[0].content[0].TEXT"},
		{metering.FormatChat, `{"messages":[{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}","Arguments":"long"}}]}]}`, "messages[0].tool_calls[0].function.Arguments"},
		{metering.FormatAnthropic, `{"system":[{"type":"text","Text":"long"}],"messages":[]}`, "system[0].Text"},
		{metering.FormatAnthropic, `{"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"a","Text":"b"}]}]}]}`, "messages[0].content[0].content[0].Text"},
		{metering.FormatResponses, `{"input":[{"type":"function_call_output","output":"a","Output":"long"}]}`, "input[0].Output"},
		// Every key the estimate reads in a Responses input item (addResponsesInput) or a chat
		// message (addChat) is compared: a reasoning item's summary and encrypted content, a
		// hosted tool's code, logs, queries and results, a chat turn's reasoning sent back.
		{metering.FormatResponses, `{"input":[{"role":"user","content":"go"},{"type":"reasoning","summary":[],"Encrypted_content":"long"}]}`, "input[1].Encrypted_content"},
		{metering.FormatResponses, `{"input":[{"type":"reasoning","Summary":[{"type":"summary_text","text":"long"}]}]}`, "input[0].Summary"},
		{metering.FormatResponses, `{"input":[{"type":"code_interpreter_call","Code":"long","Outputs":[]}]}`, "input[0].Code"},
		{metering.FormatResponses, `{"input":[{"type":"code_interpreter_call","code":"a","Outputs":[{"type":"logs","logs":"long"}]}]}`, "input[0].Outputs"},
		{metering.FormatResponses, `{"input":[{"type":"file_search_call","QUERIES":["long"]}]}`, "input[0].QUERIES"},
		{metering.FormatResponses, `{"input":[{"type":"file_search_call","queries":[],"Results":[{"text":"long"}]}]}`, "input[0].Results"},
		{metering.FormatChat, `{"messages":[{"role":"user","content":"go"},{"role":"assistant","Reasoning_content":"long","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]}]}`, "messages[1].Reasoning_content"},
		{metering.FormatChat, `{"messages":[{"role":"assistant","REASONING":"long","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]}]}`, "messages[0].REASONING"},
		// And what those keys hold, as deep as the estimate reads it: a tool output's parts
		// (or its one object), a reasoning summary's, a file search's results, a shell's
		// commands, a patch's diff, a code interpreter's logs.
		{metering.FormatResponses, `{"input":[{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","Text":"long"}]}]}`, "input[0].output[0].Text"},
		{metering.FormatResponses, `{"input":[{"type":"function_call_output","call_id":"c","output":{"type":"input_text","TEXT":"long"}}]}`, "input[0].output.TEXT"},
		{metering.FormatResponses, `{"input":[{"type":"reasoning","summary":[{"type":"summary_text","Text":"long"}]}]}`, "input[0].summary[0].Text"},
		{metering.FormatResponses, `{"input":[{"type":"file_search_call","queries":[],"results":[{"file_id":"f","Text":"long"}]}]}`, "input[0].results[0].Text"},
		{metering.FormatResponses, `{"input":[{"type":"shell_call","action":{"Commands":["long"]}}]}`, "input[0].action.Commands"},
		{metering.FormatResponses, `{"input":[{"type":"local_shell_call","action":{"type":"exec","COMMAND":["long"]}}]}`, "input[0].action.COMMAND"},
		{metering.FormatResponses, `{"input":[{"type":"apply_patch_call","operation":{"type":"update_file","Diff":"long"}}]}`, "input[0].operation.Diff"},
		{metering.FormatResponses, `{"input":[{"type":"code_interpreter_call","code":"a","outputs":[{"type":"image","url":"u"},{"type":"logs","Logs":"long"}]}]}`, "input[0].outputs[1].Logs"},
		// The parts of the prompt outside its messages, read as a message's parts are: a
		// completions prompt of text and media (llama.cpp's, one object or a batch), an
		// embeddings input of parts (Jina's), a stored prompt's variables, instructions given
		// as parts.
		{metering.FormatCompletions, `{"prompt":{"Prompt_String":"long","multimodal_data":[]}}`, "prompt.Prompt_String"},
		{metering.FormatCompletions, `{"prompt":[{"prompt_string":"a","Multimodal_data":["AAAA"]}]}`, "prompt[0].Multimodal_data"},
		{metering.FormatEmbeddings, `{"input":[{"text":"a"},{"Text":"long"}]}`, "input[1].Text"},
		{metering.FormatResponses, `{"prompt":{"id":"p","variables":{"doc":{"type":"input_text","Text":"long"}}},"input":"hi"}`, "prompt.variables.doc.Text"},
		{metering.FormatResponses, `{"prompt":{"id":"p","variables":{"doc":[{"type":"input_text","Text":"long"}]}},"input":"hi"}`, "prompt.variables.doc[0].Text"},
		{metering.FormatResponses, `{"instructions":[{"type":"input_text","Text":"long"}],"input":"hi"}`, "instructions[0].Text"},
		// Legacy function calling's arguments, a custom tool's input, a tool_use part's input
		// (spelled in another case alone, as the estimate does not read it): the estimate
		// counts each.
		{metering.FormatChat, `{"messages":[{"role":"assistant","function_call":{"name":"f","arguments":"{}","Arguments":"long"}}]}`, "messages[0].function_call.Arguments"},
		{metering.FormatChat, `{"messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"custom","custom":{"name":"f","input":"a","Input":"long"}}]}]}`, "messages[0].tool_calls[0].custom.Input"},
		{metering.FormatAnthropic, `{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","Input":{"q":"long"}}]}]}`, "messages[0].content[0].Input"},
		// Tool calls the estimate walks as an object's members (gjson's ForEach), and parts
		// nested in an array of parts (partLen), are compared too.
		{metering.FormatChat, `{"messages":[{"role":"assistant","tool_calls":{"x":{"function":{"arguments":"{}","Arguments":"long"}}}}]}`, "messages[0].tool_calls[0].function.Arguments"},
		{metering.FormatChat, `{"messages":[{"role":"user","content":[[{"type":"text","text":"a","Text":"long"}]]}]}`, "messages[0].content[0][0].Text"},
		// Parts are compared as deep as the estimate reads them (maxContentDepth): the fourth
		// nested content array is; past it the estimate counts the raw bytes, case variants and all.
		{metering.FormatAnthropic, `{"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"tool_result","content":[{"type":"tool_result","content":[{"type":"text","text":"a","Text":"long"}]}]}]}]}]}`, "messages[0].content[0].content[0].content[0].content[0].Text"},
		{metering.FormatAnthropic, `{"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"tool_result","content":[{"type":"tool_result","content":[{"type":"tool_result","content":[{"type":"text","text":"a","Text":"long"}]}]}]}]}]}]}`, ""},
		// A part's content that is one block, not a list (an Anthropic web_fetch_tool_result's
		// web_fetch_result), is read by the estimate as a part (metering's partLen): its
		// "Content" is the fetched document to a provider that folds case, which the estimate,
		// reading "content" alone, did not count (4 tokens where the document is 1 600). Past
		// the estimate's depth the block is counted whole.
		{metering.FormatAnthropic, `{"messages":[{"role":"user","content":[{"type":"web_fetch_tool_result","tool_use_id":"t","content":{"type":"web_fetch_result","url":"u","Content":{"type":"document","source":{"type":"text","media_type":"text/plain","data":"long"}}}}]}]}`, "messages[0].content[0].content.Content"},
		{metering.FormatAnthropic, `{"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"tool_result","content":{"type":"x","content":{"type":"web_fetch_result","Content":"long"}}}]}]}]}`, "messages[0].content[0].content[0].content.content.Content"},
		{metering.FormatAnthropic, `{"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"tool_result","content":[{"type":"tool_result","content":{"type":"web_fetch_result","Content":"long"}}]}]}]}]}`, "messages[0].content[0].content[0].content[0].content.Content"},
		{metering.FormatAnthropic, `{"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"tool_result","content":[{"type":"tool_result","content":[{"type":"tool_result","content":{"type":"web_fetch_result","Content":"long"}}]}]}]}]}]}`, ""},
		// Every key the estimate reads in a part is compared: a document's source (its text
		// counted), a code execution's output, a llama.cpp prompt's text and media, Jina's
		// image. The part's type is not: the estimate reads it with case folded.
		{metering.FormatAnthropic, `{"messages":[{"role":"user","content":[{"type":"document","Source":{"type":"text","media_type":"text/plain","data":"long"}}]}]}`, "messages[0].content[0].Source"},
		{metering.FormatAnthropic, `{"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"bash_code_execution_result","Stdout":"long"}]}]}]}`, "messages[0].content[0].content[0].Stdout"},
		{metering.FormatChat, `{"messages":[{"role":"user","content":[{"Prompt_String":"long","multimodal_data":[]}]}]}`, "messages[0].content[0].Prompt_String"},
		{metering.FormatChat, `{"messages":[{"role":"user","content":[{"Image":"https://x/a.png"}]}]}`, "messages[0].content[0].Image"},
		{metering.FormatChat, `{"messages":[{"role":"user","content":[{"Type":"image_url","image_url":{"url":"https://x/a.png"}}]}]}`, ""},
		// A document's source is read as the estimate reads it (metering's documentTextLen and
		// pdfPartTokens): its type, text, media type and data, and the content blocks it
		// holds. Spelt in another case, a text document of 100 KB was estimated as one media
		// part (1 600 tokens), and a PDF of many pages so too.
		{metering.FormatAnthropic, `{"messages":[{"role":"user","content":[{"type":"document","source":{"Type":"text","media_type":"text/plain","data":"long"}}]}]}`, "messages[0].content[0].source.Type"},
		{metering.FormatAnthropic, `{"messages":[{"role":"user","content":[{"type":"document","source":{"type":"text","media_type":"text/plain","Data":"long"}}]}]}`, "messages[0].content[0].source.Data"},
		{metering.FormatAnthropic, `{"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","MEDIA_TYPE":"application/pdf","data":"JVBERi0="}}]}]}`, "messages[0].content[0].source.MEDIA_TYPE"},
		{metering.FormatAnthropic, `{"messages":[{"role":"user","content":[{"type":"document","source":{"type":"content","Content":[{"type":"text","text":"long"}]}}]}]}`, "messages[0].content[0].source.Content"},
		{metering.FormatAnthropic, `{"messages":[{"role":"user","content":[{"type":"document","source":{"type":"content","content":[{"type":"text","Text":"long"}]}}]}]}`, "messages[0].content[0].source.content[0].Text"},
		// An assistant turn's thinking sent back in a tool loop (metering's thinkingLen): its
		// text, its signature (the whole thinking encrypted), a redacted block's data.
		{metering.FormatAnthropic, `{"messages":[{"role":"assistant","content":[{"type":"thinking","Thinking":"long","signature":"s"}]}]}`, "messages[0].content[0].Thinking"},
		{metering.FormatAnthropic, `{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"a","SIGNATURE":"long"}]}]}`, "messages[0].content[0].SIGNATURE"},
		{metering.FormatAnthropic, `{"messages":[{"role":"assistant","content":[{"type":"redacted_thinking","Data":"long"}]}]}`, "messages[0].content[0].Data"},
		// A PDF given as a data URL (a Responses input_file's file_data, a chat file part's
		// file.file_data) is estimated by its pages (metering's pdfPartTokens): spelt in
		// another case, it was one media part, 1 600 tokens, whatever its pages.
		{metering.FormatResponses, `{"input":[{"role":"user","content":[{"type":"input_file","File_data":"data:application/pdf;base64,JVBERi0="}]}]}`, "input[0].content[0].File_data"},
		{metering.FormatChat, `{"messages":[{"role":"user","content":[{"type":"file","FILE":{"file_data":"data:application/pdf;base64,JVBERi0="}}]}]}`, "messages[0].content[0].FILE"},
		{metering.FormatChat, `{"messages":[{"role":"user","content":[{"type":"file","file":{"File_Data":"data:application/pdf;base64,JVBERi0="}}]}]}`, "messages[0].content[0].file.File_Data"},
		// Past the estimate's depth a source's content blocks count by their bytes.
		{metering.FormatAnthropic, `{"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"tool_result","content":[{"type":"tool_result","content":[{"type":"document","source":{"type":"content","content":[{"type":"text","Text":"long"}]}}]}]}]}]}]}`, ""},
		// Case variants the estimate does not read, or inside what it counts whole, pass.
		{metering.FormatAnthropic, `{"messages":[{"role":"assistant","content":[{"type":"tool_use","input":{"id":1,"ID":2}}]}]}`, ""},
		{metering.FormatChat, `{"tools":[{"type":"function","function":{"parameters":{"properties":{"id":{},"ID":{}}}}}],"messages":[{"role":"user","content":"a"}]}`, ""},
		{metering.FormatChat, `{"messages":[{"role":"user","content":"a","name":"x"}]}`, ""},
		// A repeated empty key is found, and named so that the path does not read as none.
		{metering.FormatChat, `{"messages":[{"role":"user","":0,"":1,"content":"a","Content":"long"}]}`, `messages[0].""`},
		{metering.FormatChat, `{"messages":[{"role":"assistant","tool_calls":[{"":0,"":1,"function":{}}]}]}`, `messages[0].tool_calls[0].""`},
		{metering.FormatChat, `{"messages":[{"role":"user","content":[{"":0,"":1,"text":"a","Text":"long"}]}]}`, `messages[0].content[0].`},
	}
	for _, tc := range cases {
		if got := repeatedPromptKey(tc.f, indexTop(gjson.Parse(tc.body))); got != tc.want {
			t.Errorf("repeatedPromptKey(%s) = %q, want %q", tc.body, got, tc.want)
		}
	}
}

// BenchmarkRepeatedKeyAnywhere is the check at any depth on the bodies that make it work
// hardest: one object of many distinct keys (its set), and many small objects (its list).
func BenchmarkRepeatedKeyAnywhere(b *testing.B) {
	for _, shape := range []struct{ name, open, item, close string }{
		{"one object", `{"o":{`, `"k%d":0,`, `"end":0}}`},
		{"many objects", `{"a":[`, `{"role":"user","content":"k%d","name":"x"},`, `{}]}`},
	} {
		b.Run(shape.name, func(b *testing.B) {
			var sb strings.Builder
			sb.WriteString(shape.open)
			for i := 0; sb.Len() < 4<<20; i++ {
				fmt.Fprintf(&sb, shape.item, i)
			}
			sb.WriteString(shape.close)
			raw := sb.String()
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				if k, ok := repeatedKeyAnywhere(raw); ok {
					b.Fatalf("repeated key %q in a body of distinct keys", k)
				}
			}
		})
	}
}

// repeatedKeyAnywhere names a key repeated below many long keys at the cost of one pass over
// the body: its path was built by concatenating every enclosing key again at each level, a
// time and garbage quadratic in the body (1000 levels of 2 KiB keys, a 2 MiB body: a GiB
// allocated, seconds of CPU, before anything was held), and quoted whole.
func TestRepeatedKeyAnywhereDeepBelowLongKeys(t *testing.T) {
	long := strings.Repeat("k", 2<<10)
	var b strings.Builder
	b.WriteString(`{"model":"m",`)
	for range 1000 {
		b.WriteString(`"` + long + `":[{`)
	}
	b.WriteString(`"a":1,"a":2` + strings.Repeat("}]", 1000) + `}`)
	body := b.String()
	if !gjson.Valid(body) {
		t.Fatal("test body is not JSON")
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	got, found := repeatedKeyAnywhere(body)
	runtime.ReadMemStats(&after)
	if !found {
		t.Fatal("the repeated key was not found")
	}
	if want := quotedValue(long + "[]." + long); got != want {
		t.Errorf("path %.80s… (%d bytes), want %.80s… (%d bytes)", got, len(got), want, len(want))
	}
	// A bound far above one pass's garbage (none but the path) and far below the quadratic
	// gigabyte: what other goroutines allocate meanwhile is counted too.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16*uint64(len(body)) {
		t.Errorf("finding the repeat in a %d-byte body allocated %d bytes, want at most 16 times the body", len(body), alloc)
	}
}

// wideKeys is n distinct keys "k0" to "k<n-1>", each followed by a comma.
func wideKeys(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `"k%d":%d,`, i, i)
	}
	return b.String()
}
