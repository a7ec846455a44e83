package metering

import (
	"bytes"
	"compress/zlib"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
)

// testPDF is a PDF of n pages: its page objects in the open, or packed (a compressed object
// stream, as pdfTeX and other PDF 1.5 writers pack them).
func testPDF(t *testing.T, n int, packed bool) []byte {
	t.Helper()
	var pages bytes.Buffer
	for i := range n {
		fmt.Fprintf(&pages, "<</Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R>>\n", 1000+i)
	}
	var b bytes.Buffer
	b.WriteString("%PDF-1.5\n1 0 obj <</Type/Catalog/Pages 2 0 R/PageLabels 5 0 R>> endobj\n")
	fmt.Fprintf(&b, "2 0 obj <</Type/Pages/Count %d>> endobj\n", n)
	if !packed {
		b.Write(pages.Bytes())
	} else {
		var z bytes.Buffer
		zw := zlib.NewWriter(&z)
		if _, err := zw.Write(pages.Bytes()); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "4 0 obj <</Type /ObjStm /N %d /First 0 /Filter /FlateDecode /Length %d>>\nstream\r\n", n, z.Len())
		b.Write(z.Bytes())
		b.WriteString("\r\nendstream endobj\n")
	}
	b.WriteString("trailer <</Root 1 0 R>>\n%%EOF\n")
	return b.Bytes()
}

// TestPDFInPromptEstimatedByItsPages: a PDF sent inline is billed by its pages (each page's
// text and an image of it); counted as one file whatever its pages, a 40-page PDF was held,
// and charged when its call was cut before its usage came, as one picture (1 600 tokens).
func TestPDFInPromptEstimatedByItsPages(t *testing.T) {
	bodies := map[string]struct {
		f    Format
		body func(b64 string) string
	}{
		"anthropic document": {FormatAnthropic, func(b64 string) string {
			return `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"` + b64 + `"}}]}]}`
		}},
		"chat file": {FormatChat, func(b64 string) string {
			return `{"model":"m","messages":[{"role":"user","content":[{"type":"file","file":{"filename":"a.pdf","file_data":"data:application/pdf;base64,` + b64 + `"}}]}]}`
		}},
		"responses input_file": {FormatResponses, func(b64 string) string {
			return `{"model":"m","input":[{"role":"user","content":[{"type":"input_file","filename":"a.pdf","file_data":"data:application/pdf;base64,` + b64 + `"}]}]}`
		}},
	}
	for name, tc := range bodies {
		for _, packed := range []bool{false, true} {
			for _, pages := range []int{1, 40} {
				b64 := base64.StdEncoding.EncodeToString(testPDF(t, pages, packed))
				in, _ := EstimatePrompt(tc.f, []byte(tc.body(b64)))
				want := int64(pages * tokensPerPDFPage)
				if in < want || in > want+100 {
					t.Errorf("%s, %d pages (packed %v): estimated %d input tokens, want %d and the message's overhead", name, pages, packed, in, want)
				}
			}
		}
		// What is no PDF whose pages can be counted counts as a file does.
		for _, b64 := range []string{"", "%%%% not base64", base64.StdEncoding.EncodeToString([]byte("%PDF-1.7 but nothing in it"))} {
			in, _ := EstimatePrompt(tc.f, []byte(tc.body(b64)))
			if in < tokensPerMedia || in > tokensPerMedia+100 {
				t.Errorf("%s, data %q: estimated %d input tokens, want a file's %d and the message's overhead", name, b64, in, tokensPerMedia)
			}
		}
	}
}

// TestPDFPagesCountsPageObjectsOnly: /Pages (the page tree's nodes), /PageLabels and the like
// are not pages; whitespace of any kind may stand between /Type and /Page; a compressed object
// stream that inflates past maxPDFInflated is read no further.
func TestPDFPagesCountsPageObjectsOnly(t *testing.T) {
	for in, want := range map[string]int64{
		"<</Type/Page>>":                       1,
		"<</Type\r\n\t/Page/Parent 1 0 R>>":    1,
		"<</Type/Pages/Count 3>>":              0,
		"<</Type /PageLabel>>":                 0,
		"<</XType/Page>> <</Type/Page(x)>>":    1,
		strings.Repeat("<</Type /Page>>\n", 7): 7,
	} {
		if got := pdfPages([]byte(in)); got != want {
			t.Errorf("pdfPages(%q) = %d, want %d", in, got, want)
		}
	}
	stream := func(filler []byte) []byte {
		var z bytes.Buffer
		zw := zlib.NewWriter(&z)
		_, _ = zw.Write(filler)
		_, _ = zw.Write([]byte("<</Type/Page>>"))
		_ = zw.Close()
		return append([]byte("<</Type/ObjStm>>stream\n"), z.Bytes()...)
	}
	// Hex deflates about twice over, inside the ratio: only maxPDFInflated stops it.
	noise := make([]byte, maxPDFInflated/2)
	_, _ = rand.Read(noise)
	for name, filler := range map[string][]byte{
		"zeros past the inflation ratio": make([]byte, 64<<10),
		"hex past maxPDFInflated":        []byte(hex.EncodeToString(noise)),
	} {
		if got := pdfPages(stream(filler)); got != 0 {
			t.Errorf("a stream inflating %s before its page: %d pages, want 0 (read no further than the bound)", name, got)
		}
	}
	if got := pdfPages(stream(make([]byte, 100))); got != 1 {
		t.Errorf("a stream inflating 100 zeros before its page: %d pages, want 1", got)
	}
}

// TestPDFPagesAddsThePagesOfEachObjectStream: a PDF written in increments packs pages into
// several object streams; its pages are those in the open and in each stream: 1, 3 and 2 are
// 6 pages. Mutant: a stream's pages taken for the count when more than the count so far (3).
func TestPDFPagesAddsThePagesOfEachObjectStream(t *testing.T) {
	pdf := []byte("%PDF-1.5\n3 0 obj <</Type /Page>> endobj\n")
	pdf = append(pdf, objStm("/ObjStm", []byte(strings.Repeat("<</Type /Page>>\n", 3)))...)
	pdf = append(pdf, objStm("/ObjStm", []byte(strings.Repeat("<</Type /Page>>\n", 2)))...)
	if got := pdfPages(pdf); got != 6 {
		t.Errorf("a page in the open, streams of 3 and 2: %d pages, want 6", got)
	}
}
