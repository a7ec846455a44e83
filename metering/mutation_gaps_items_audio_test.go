package metering

import (
	"bytes"
	"compress/zlib"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// TestMeterKeepsTheOutputItemsIDsOnce: a Responses stream names each output item when it is
// added and when it is done; the Meter keeps each id once, whatever came between, an id as long
// as a model name but none longer, and no empty one. Mutants: the look for a repeat stopping
// before the first id kept (a done naming it again after another item's added), the length
// bound off by one, an empty id kept.
func TestMeterKeepsTheOutputItemsIDsOnce(t *testing.T) {
	longest := strings.Repeat("i", maxModelName)
	item := func(typ, id string) Event {
		return data(`{"type":"response.output_item.` + typ + `","item":{"type":"message","id":"` + id + `"}}`)
	}
	got := meterEvents(FormatResponses,
		item("added", "msg_a"), item("added", "msg_b"), item("done", "msg_a"), item("done", "msg_b"),
		item("added", ""), item("added", longest+"x"), item("added", longest), item("done", longest))
	if want := []string{"msg_a", "msg_b", longest}; !slices.Equal(got.ItemIDs, want) {
		t.Errorf("item ids %q, want %q", got.ItemIDs, want)
	}
}

// TestMeterKeepsAtMostMaxItemIDs: an answer of more output items than maxItemIDs has its first
// maxItemIDs ids kept, the rest not. Mutants: the bound off by one, or dropped (an answer of
// thousands of hosted tool calls grows the Meter without end).
func TestMeterKeepsAtMostMaxItemIDs(t *testing.T) {
	var out []string
	for i := range maxItemIDs + 5 {
		out = append(out, `{"type":"function_call","id":"fc_`+strconv.Itoa(i)+`","arguments":"{}"}`)
	}
	m := NewMeter(FormatResponses)
	m.Body([]byte(`{"id":"resp_1","object":"response","model":"m","output":[` + strings.Join(out, ",") + `]}`))
	ids := m.Result().ItemIDs
	if len(ids) != maxItemIDs || ids[0] != "fc_0" || ids[maxItemIDs-1] != "fc_"+strconv.Itoa(maxItemIDs-1) {
		t.Errorf("%d item ids kept (first %q), want the first %d", len(ids), ids[:min(1, len(ids))], maxItemIDs)
	}
}

// TestMeterItemIDsOutliveTheEventsMemory: the caller reuses an event's memory for the next;
// an item id kept is a copy. Mutant: the id kept as a view of the event, which the next event
// overwrites (a later request naming the item is then checked against another id).
func TestMeterItemIDsOutliveTheEventsMemory(t *testing.T) {
	buf := []byte(`{"type":"response.output_item.added","item":{"type":"message","id":"msg_a"}}`)
	m := NewMeter(FormatResponses)
	m.Event(Event{Data: buf})
	copy(buf, strings.Repeat("z", len(buf)))
	if got := m.Result().ItemIDs; !slices.Equal(got, []string{"msg_a"}) {
		t.Errorf("item ids %q after the event's memory was reused, want [msg_a]", got)
	}
}

// TestInputItemIDsListsEachIDOnce: the ids a Responses input names, under "id" in any case (a
// relay decoding with Go's encoding/json reads "ID" as the id), each once, none empty, none
// longer than a model name. Mutants: the key compared as written, a repeat listed again, an
// empty id listed, the length bound off by one.
func TestInputItemIDsListsEachIDOnce(t *testing.T) {
	longest := strings.Repeat("i", maxModelName)
	body := `{"model":"m","input":[{"type":"item_reference","id":"rs_1"},` +
		`{"type":"message","role":"assistant","ID":"msg_2","content":[{"type":"output_text","text":"hi"}]},` +
		`{"type":"item_reference","id":"rs_1"},{"type":"item_reference","id":""},` +
		`{"type":"item_reference","id":"` + longest + `x"},{"type":"item_reference","id":"` + longest + `"},` +
		`{"role":"user","content":"next"}]}`
	ids, more := InputItemIDs([]byte(body), 10)
	if want := []string{"rs_1", "msg_2", longest}; !slices.Equal(ids, want) || more {
		t.Errorf("ids %q (more %v), want %q (more false)", ids, more, want)
	}
}

// TestInputItemIDsSaysWhenMoreThanTheLimit: a request naming exactly limit distinct ids lists
// them all (a repeat of one past the limit is none new); one naming a distinct id past the
// limit lists the first limit and says there are more, and is refused rather than checked in
// part. Mutants: the limit off by one, more never said.
func TestInputItemIDsSaysWhenMoreThanTheLimit(t *testing.T) {
	input := func(ids ...string) []byte {
		var items []string
		for _, id := range ids {
			items = append(items, `{"type":"item_reference","id":"`+id+`"}`)
		}
		return []byte(`{"input":[` + strings.Join(items, ",") + `]}`)
	}
	if ids, more := InputItemIDs(input("a", "b", "c", "a"), 3); !slices.Equal(ids, []string{"a", "b", "c"}) || more {
		t.Errorf("3 distinct ids, limit 3: %q (more %v), want all three, more false", ids, more)
	}
	if ids, more := InputItemIDs(input("a", "b", "c", "d"), 3); !slices.Equal(ids, []string{"a", "b", "c"}) || !more {
		t.Errorf("4 distinct ids, limit 3: %q (more %v), want the first three, more true", ids, more)
	}
}

// TestPDFEstimateIsTwoThousandTokensAPage: a PDF of 40 pages sent inline estimates 80 000
// tokens (and the message's few), in any case of its media type, as Anthropic and OpenAI
// read it. Mutants: another rate a page; the media type compared as written, a PDF labelled
// "Application/PDF" counted as one file (1 600 tokens).
func TestPDFEstimateIsTwoThousandTokensAPage(t *testing.T) {
	b64 := base64.StdEncoding.EncodeToString(testPDF(t, 40, true))
	for name, tc := range map[string]struct {
		f    Format
		body string
	}{
		"anthropic document": {FormatAnthropic, `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"document",` +
			`"source":{"type":"base64","media_type":"Application/PDF","data":"` + b64 + `"}}]}]}`},
		"chat file": {FormatChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"file",` +
			`"file":{"filename":"a.pdf","file_data":"data:Application/PDF;base64,` + b64 + `"}}]}]}`},
	} {
		if in, _ := EstimatePrompt(tc.f, []byte(tc.body)); in < 80_000 || in > 80_100 {
			t.Errorf("%s, 40 pages: estimated %d input tokens, want 80 000 and the message's overhead", name, in)
		}
	}
}

// TestPDFPartEstimateBounded: a part's estimate stops at maxEstimatedTokens, however many page
// objects its PDF holds (here 540 000, 1.08 billion tokens at 2 000 a page). Mutant: the bound
// dropped. (EstimatePrompt bounds its total too, so the prompt's figure is the same.)
func TestPDFPartEstimateBounded(t *testing.T) {
	const pages = maxEstimatedTokens/tokensPerPDFPage + 3
	pdf := "%PDF-1.4\n" + strings.Repeat("<</Type/Page>>", pages)
	part := gjson.Parse(`{"type":"file","file":{"file_data":"data:application/pdf;base64,` + base64.StdEncoding.EncodeToString([]byte(pdf)) + `"}}`)
	if tokens, ok := pdfPartTokens(part); !ok || tokens != maxEstimatedTokens {
		t.Errorf("a PDF of %d pages: %d tokens (ok %v), want the bound %d", pages, tokens, ok, int64(maxEstimatedTokens))
	}
}

// TestPDFPagesInflationBoundIsThePDFs: maxPDFInflated bounds what one PDF's object streams
// inflate together, not each: a page past it in a second stream is not read. Mutants: each
// stream inflating the whole bound (a PDF of many streams inflating gigabytes).
func TestPDFPagesInflationBoundIsThePDFs(t *testing.T) {
	// Hex deflates about twice over, inside the ratio: only the bound stops it.
	noise := make([]byte, maxPDFInflated*5/16)
	_, _ = rand.Read(noise)
	stm := objStm("/ObjStm", append([]byte(hex.EncodeToString(noise)), "<</Type/Page>>"...)) // 5/8 of the bound, then a page
	if got := pdfPages(bytes.Repeat(stm, 2)); got != 1 {
		t.Errorf("two streams each inflating 5/8 of the bound before a page: %d pages, want 1 (the second read only to the bound)", got)
	}
}

// objStm is a compressed object stream (/Type /ObjStm, or typ) holding objs.
func objStm(typ string, objs []byte) []byte {
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	_, _ = zw.Write(objs)
	_ = zw.Close()
	return append(append([]byte("<</Type "+typ+" /Filter /FlateDecode>>\nstream\n"), z.Bytes()...), "\nendstream\n"...)
}

// TestPDFPagesReadsAWholeObjectStreamInsideTheRatio: a stream of 600 page objects that differ
// from each other (deflating about twice over, as a PDF's dictionaries do) counts every page,
// past the 32 KiB the inflater reads at a time. Mutant: the compressed bytes the inflater reads
// one at a time not counted, every stream read no further than its first 32 KiB.
func TestPDFPagesReadsAWholeObjectStreamInsideTheRatio(t *testing.T) {
	var objs bytes.Buffer
	for i := range 600 {
		id := make([]byte, 24)
		_, _ = rand.Read(id)
		fmt.Fprintf(&objs, "<</Type /Page /Parent 2 0 R /Contents %d 0 R /PieceInfo <%x>>>\n", 1000+i, id)
	}
	if objs.Len() <= 32<<10 {
		t.Fatalf("the stream inflates to %d bytes, not past one read", objs.Len())
	}
	if got := pdfPages(objStm("/ObjStm", objs.Bytes())); got != 600 {
		t.Errorf("a stream of 600 page objects (%d bytes inflated): %d pages, want 600", objs.Len(), got)
	}
}

// TestPDFPagesStopsAStreamPastTheInflationRatio: a stream that inflates more than
// maxInflateRatio bytes for each compressed byte is read no further, its page past that not
// counted: a body's PDFs inflate at most that many times its size. Mutant: a looser ratio (64).
func TestPDFPagesStopsAStreamPastTheInflationRatio(t *testing.T) {
	// Lines alike but for a few random hex digits: about 20 times over.
	var filler bytes.Buffer
	for filler.Len() < 512<<10 {
		id := make([]byte, 2)
		_, _ = rand.Read(id)
		fmt.Fprintf(&filler, "%% a comment line that repeats itself but for its last digits, %x\n", id)
	}
	stm := objStm("/ObjStm", append(filler.Bytes(), "<</Type/Page>>"...))
	if ratio := filler.Len() / len(stm); ratio < 12 || ratio > 40 {
		t.Fatalf("the filler deflates %d times over, want about 20", ratio)
	}
	if got := pdfPages(stm); got != 0 {
		t.Errorf("a stream deflating %d times over before its page: %d pages, want 0", filler.Len()/len(stm), got)
	}
}

// TestPDFPagesObjectStreamIsThatName: only /ObjStm marks an object stream, not a longer name
// it starts. Mutant: any name starting /ObjStm read as one, its stream inflated and counted.
func TestPDFPagesObjectStreamIsThatName(t *testing.T) {
	if got := pdfPages(objStm("/ObjStmX", []byte("<</Type/Page>>"))); got != 0 {
		t.Errorf("a stream of /Type /ObjStmX: %d pages, want 0", got)
	}
	if got := pdfPages(objStm("/ObjStm", []byte("<</Type/Page>>"))); got != 1 {
		t.Errorf("a stream of /Type /ObjStm: %d pages, want 1", got)
	}
}

// TestPDFEndingInAPageNameCountsIt: a PDF whose data ends right after "/Type /Page" (cut
// short, or hostile) counts that page, whatever its length modulo 3 (base64 padded or not).
// Mutant: the look past the name reading a byte past the data, and the request panicking.
func TestPDFEndingInAPageNameCountsIt(t *testing.T) {
	for _, pad := range []string{"", " ", "  "} {
		pdf := "%PDF-1.4\n" + pad + "1 0 obj <</Type /Page"
		for _, b64 := range []string{base64.StdEncoding.EncodeToString([]byte(pdf)), base64.RawStdEncoding.EncodeToString([]byte(pdf))} {
			body := `{"model":"m","messages":[{"role":"user","content":[{"type":"file","file":{"file_data":"data:application/pdf;base64,` + b64 + `"}}]}]}`
			if in, _ := EstimatePrompt(FormatChat, []byte(body)); in < tokensPerPDFPage || in > tokensPerPDFPage+100 {
				t.Errorf("a PDF of %d bytes ending in its page's name (%q): estimated %d tokens, want one page's %d", len(pdf), b64, in, tokensPerPDFPage)
			}
		}
	}
}

// clipPromptTokens is what EstimateAudioInputTokens counts of a chat prompt of one audio
// clip of base64 data.
func clipPromptTokens(data string) int64 {
	body := `{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"` + data + `","format":"mp3"}}]}]}`
	return EstimateAudioInputTokens(FormatChat, []byte(body))
}

// mp3FrameMicros is how long one frame of mpeg1(1, 32) plays: 1 152 samples at 44.1 kHz.
const mp3FrameMicros = 1152 * 1_000_000 / 44_100

// TestMP3ClipWithLineBreaksTimedByItsFrames: base64 written in lines (MIME's 76 characters and
// CRLF), which a decoder reads past, times as the same data in one line: 60 s, 600 tokens.
// Mutant: the line breaks taken for data, the walk ending at the first of them.
func TestMP3ClipWithLineBreaksTimedByItsFrames(t *testing.T) {
	data := b64(mpeg1(9, 128).frames(60))
	var lines []string
	for len(data) > 76 {
		lines, data = append(lines, data[:76]), data[76:]
	}
	wrapped := strings.Join(append(lines, data), `\r\n`)
	if got := clipPromptTokens(wrapped); got < 600 || got > 602 {
		t.Errorf("60 s of MP3 in lines of 76 characters: %d tokens, want 600", got)
	}
}

// TestMP3ClipEndsAtItsFirstPaddedQuantum: base64 ends where a quantum is padded, as a decoder
// reads it: frames after the padding are not the clip's, even when the padded quantum ends one
// of the walk's 1 024-character buffers. Seven frames (183 ms) then padding, then 50 s of
// frames, is 2 tokens. Mutant: a padded quantum read as the data's end only when the decoder
// reports an error (more follows in the same buffer), the 50 s counted.
func TestMP3ClipEndsAtItsFirstPaddedQuantum(t *testing.T) {
	head := b64(append(mpeg1(1, 32).frames(1)[:7*104], make([]byte, 766-7*104)...)) // 766 bytes: 1 024 characters, "==" last
	if len(head) != 1024 || !strings.HasSuffix(head, "==") {
		t.Fatalf("head of %d characters (%q last), want 1 024 ending in padding", len(head), head[len(head)-2:])
	}
	if got, want := clipPromptTokens(head+b64(mpeg1(1, 32).frames(50))), ceilDiv(7*mp3FrameMicros*audioTokensPerSecond, 1_000_000); got != want {
		t.Errorf("7 frames, padding, 50 s of frames: %d tokens, want %d (the 7 frames)", got, want)
	}
}

// TestMP3WalkJunkBoundIsInclusive: a decoder resynchronises past junk, and so does the walk
// up to maxMP3Junk bytes of it: exactly that many bytes without a frame sync between two runs
// of 64 frames play as the 128 frames (34 tokens); one more, or a run past the bound with no
// 0xff in it, and the rest of the data from where the junk began is timed at the lowest bit
// rate (1 000 bytes a second). The junk here ends where one of the walk's buffers of 768
// decoded bytes does. Mutants: the bound exclusive (in either of the two places it is
// checked); the rest timed from where the walk noticed the bound was passed rather than from
// where the junk began (a long stretch of junk played as nothing).
func TestMP3WalkJunkBoundIsInclusive(t *testing.T) {
	run := mpeg1(1, 32).frames(3)[:64*104] // 64 frames of 104 bytes: 6 656 bytes
	if (len(run)+maxMP3Junk)%768 != 0 {
		t.Fatalf("the junk ends at %d, not at the end of a buffer", len(run)+maxMP3Junk)
	}
	junk := func(n int) []byte { return bytes.Repeat([]byte{0x12}, n) }
	runMicros := int64(64 * mp3FrameMicros)
	lowest := func(from, total int) int64 { return int64(total-from) * 1_000_000 / mp3LowestByteRate }
	for _, tc := range []struct {
		name string
		junk int
		want int64 // µs
	}{
		{"exactly the bound", maxMP3Junk, 2 * runMicros},
		{"one byte past it", maxMP3Junk + 1, runMicros + lowest(len(run), 2*len(run)+maxMP3Junk+1)},
		{"100 000 bytes", 100_000, runMicros + lowest(len(run), 2*len(run)+100_000)},
	} {
		data := b64(run, junk(tc.junk), run)
		// The rest's length is read from the characters (DecodedLen), padding counted: up
		// to 2 bytes, 2 ms, more.
		lo, hi := ceilDiv(tc.want*audioTokensPerSecond, 1_000_000), ceilDiv((tc.want+2_000)*audioTokensPerSecond, 1_000_000)
		if got := clipPromptTokens(data); got < lo || got > hi {
			t.Errorf("64 frames, %s of junk (%d bytes), 64 frames: %d tokens, want %d", tc.name, tc.junk, got, lo)
		}
	}
}

// TestMP3WalkJunkPastTheBoundAtTheEndIsTimed: a skip that ends the data counts toward the
// junk bound as one cut short by the data's end does: 25 frames (600 ms), exactly maxMP3Junk
// bytes of junk up to a 0xff, then a last header that is no frame and that the data ends in.
// Its 4 bytes pass the bound, and the rest from where they start (their bytes and the base64
// padding, DecodedLen) is timed at the lowest rate. Mutant: the bound looked at only while
// bytes come, the last header played as nothing (6 tokens, not 7).
func TestMP3WalkJunkPastTheBoundAtTheEndIsTimed(t *testing.T) {
	frame := make([]byte, 24) // MPEG-2 Layer III, 8 kbit/s, 24 kHz: 576 samples, 24 000 µs
	copy(frame, []byte{0xff, 0xf3, 0x14, 0x00})
	run := bytes.Repeat(frame, 25)
	junk := make([]byte, maxMP3Junk) // no 0xff: a skip from its start to the header after it
	last := []byte{0xff, 0x00, 0x00, 0x00}
	data := b64(run, junk, last)
	from := int64(len(run) + len(junk))
	total := int64(base64.StdEncoding.DecodedLen(len(data)))
	want := 25*24_000 + (total-from)*1_000_000/mp3LowestByteRate
	if got := clipMicros(data); got != want {
		t.Errorf("25 frames, %d bytes of junk, a last header that is no frame: %d µs, want %d", maxMP3Junk, got, want)
	}
	if got, wantTokens := clipPromptTokens(data), ceilDiv(want*audioTokensPerSecond, 1_000_000); got != wantTokens {
		t.Errorf("its estimate: %d tokens, want %d", got, wantTokens)
	}
}

// TestMP3WalkResyncsInsideAHeader: a frame sync among the 3 bytes after a header that is no
// frame is where the walk goes on, as a decoder does: 4 runs of 10 frames with 3 bytes of junk
// between them play as the 40 frames (1.04 s, 11 tokens). Mutants: the last of the header's
// bytes not looked at, or the header's bytes after the sync dropped, a frame lost at each junk
// (37 frames, 10 tokens).
func TestMP3WalkResyncsInsideAHeader(t *testing.T) {
	run := mpeg1(1, 32).frames(1)[:10*104]
	gap := []byte{0x12, 0x34, 0x56}
	data := b64(run, gap, run, gap, run, gap, run)
	if got, want := clipPromptTokens(data), ceilDiv(40*mp3FrameMicros*audioTokensPerSecond, 1_000_000); got != want {
		t.Errorf("4 runs of 10 frames, 3 bytes of junk between: %d tokens, want %d (40 frames)", got, want)
	}
}

// TestUnrelayedRawPCMLikeAFileLaterCountsItsBytes: a spoken answer of raw PCM (pcm16) is told
// from a file by its start alone: bytes further in that look like a WAV header do not make it
// one. Read past in pieces, its 20 000 bytes count as PCM (0.42 s), as read whole. Mutant: data
// whose start is no file left undecided, the header 1 536 bytes in (where the next 2 048
// characters begin) read as a WAV file of 1 000 bytes a second (20 s).
func TestUnrelayedRawPCMLikeAFileLaterCountsItsBytes(t *testing.T) {
	pcm := make([]byte, 20_000)
	_, _ = rand.Read(pcm[:1536])
	wav, _ := base64.StdEncoding.DecodeString(wavClip(1_000, 0))
	copy(pcm[1536:], wav)
	body := `{"choices":[{"message":{"role":"assistant","audio":{"id":"audio_1","data":"` + base64.StdEncoding.EncodeToString(pcm) + `"}}}]}`
	if pcmBytes, us := measureWhole(body); pcmBytes != 20_000 || us != 0 {
		t.Fatalf("read whole: %d bytes of PCM, %d µs of files; want 20 000, 0", pcmBytes, us)
	}
	for _, size := range []int{1, 100, 4096, len(body)} {
		if pcmBytes, us := measurePieces(body, func() int { return size }); pcmBytes != 20_000 || us != 0 {
			t.Errorf("in pieces of %d: %d bytes of PCM, %d µs of files; want 20 000, 0", size, pcmBytes, us)
		}
	}
}
