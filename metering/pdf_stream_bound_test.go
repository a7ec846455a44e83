package metering

import (
	"bytes"
	"encoding/base64"
	"runtime"
	"strings"
	"testing"
)

// TestPDFPagesReadsEachObjectStreamOnce: a PDF naming /ObjStm many times before one stream (a
// page in it) counts that stream's page once, not once for each name; the look for the next
// /ObjStm goes on past the stream read. Without it each name looked from itself for the next
// "stream", scanning and inflating the rest of the PDF again: quadratic in the body, and the
// stream's pages counted as many times as the names before it (held and, cut before a usage
// report, charged as 2 000 tokens each).
func TestPDFPagesReadsEachObjectStreamOnce(t *testing.T) {
	pdf := append([]byte("%PDF-1.5\n"), bytes.Repeat([]byte("/ObjStm "), 1000)...)
	pdf = append(pdf, objStm("/ObjStm", []byte("<</Type /Page>>"))...)
	if got := pdfPages(pdf); got != 1 {
		t.Errorf("1 000 /ObjStm names before one stream of one page: %d pages, want 1", got)
	}
	// A stream cut at its keyword, or in its header, ends the look.
	for _, end := range []string{"stream", "stream\n", "stream\nx"} {
		if got := pdfPages([]byte("<</Type /Page>> /ObjStm " + end)); got != 1 {
			t.Errorf("a PDF ending in %q: %d pages, want 1", end, got)
		}
	}
}

// TestPDFPagesManyStreamsAllocateLittle: a PDF (as large as a default 4 MiB body carries) of
// 175 000 streams that inflate to nothing, each a zlib header and a bad block, is read with one
// inflater and buffer. A new inflater and 32 KiB buffer for each allocated some 70 KiB a
// stream, 12 GB for the PDF: seconds of a core spent on the estimate, before the call is
// admitted or its caller's balance looked at. Measured in bytes allocated (not time): at most
// 16 times the PDF.
func TestPDFPagesManyStreamsAllocateLittle(t *testing.T) {
	unit := []byte("/ObjStm stream\nx\x9c\x07")
	pdf := append([]byte("%PDF-1.5\n<</Type /Page>>\n"), bytes.Repeat(unit, (3<<20)/len(unit))...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	pages := pdfPages(pdf)
	runtime.ReadMemStats(&after)
	if pages != 1 {
		t.Errorf("one page in the open, streams of nothing: %d pages, want 1", pages)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16*uint64(len(pdf)) {
		t.Errorf("a %d-byte PDF of %d empty streams allocated %d bytes to count its pages, want at most %d", len(pdf), (3<<20)/len(unit), alloc, 16*len(pdf))
	}
}

// TestPDFPromptOfManyPDFsAllocatesLittle: a prompt of 45 000 tiny PDFs, each a stream that
// inflates to nothing, reads them with the inflaters the PDFs before them were read with. A
// new inflater and 32 KiB buffer for each PDF allocated some 73 KiB a PDF, 3.3 GB for a 4 MiB
// body, before the call was admitted. At most half that a PDF: the race detector's sync.Pool
// drops a quarter of what is put back.
func TestPDFPromptOfManyPDFsAllocatesLittle(t *testing.T) {
	part := `{"type":"file","file":{"file_data":"data:application/pdf;base64,` +
		base64.StdEncoding.EncodeToString([]byte("/ObjStm stream\nx\x9c\x07")) + `"}}`
	n := (4 << 20) / (len(part) + 1)
	body := []byte(`{"model":"m","messages":[{"role":"user","content":[` + strings.Repeat(part+",", n-1) + part + `]}]}`)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	in, _ := EstimatePrompt(FormatChat, body)
	runtime.ReadMemStats(&after)
	if want := int64(n) * tokensPerMedia; in < want {
		t.Errorf("%d PDFs of no page: estimated %d input tokens, want at least a file's %d each", n, in, tokensPerMedia)
	}
	alloc, most := after.TotalAlloc-before.TotalAlloc, uint64(n)*36<<10
	t.Logf("%d PDFs: %d bytes allocated (%d a PDF)", n, alloc, alloc/uint64(n))
	if alloc > most {
		t.Errorf("a prompt of %d tiny PDFs allocated %d bytes to estimate, want at most %d (36 KiB a PDF)", n, alloc, most)
	}
}
