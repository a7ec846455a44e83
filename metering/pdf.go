package metering

import (
	"bytes"
	"compress/zlib"
	"encoding/base64"
	"io"
	"strings"
	"sync"

	"github.com/tidwall/gjson"
)

// tokensPerPDFPage stands for one page of a PDF sent in a prompt: Anthropic and OpenAI bill
// each page's extracted text and an image of it, a couple of thousand tokens a page. Counted as
// one file (tokensPerMedia) whatever its pages, a 100-page PDF was held and, cut before its
// usage came, charged as one picture.
const tokensPerPDFPage = 2000

// maxPDFInflated bounds the bytes inflated from one PDF's compressed object streams while its
// pages are counted, and maxInflateRatio the bytes inflated from each compressed byte read: a
// small compressed stream can inflate to gigabytes, and a body of many small PDFs would each
// inflate the whole bound. Object streams hold a PDF's dictionaries, which deflate a few times
// over, well inside the ratio; a body's PDFs inflate at most that many times its size.
const (
	maxPDFInflated  = 4 << 20
	maxInflateRatio = 8
)

// pdfPartTokens estimates a media part that carries a PDF inline, base64: an Anthropic
// document's source, a chat file's file_data, a Responses input_file's file_data (both data
// URLs). ok is false when the part holds no PDF whose pages could be counted: it is then
// counted as any file is (tokensPerMedia).
func pdfPartTokens(part gjson.Result) (tokens int64, ok bool) {
	var data string
	if src := part.Get("source"); src.Get("type").Str == "base64" {
		if !strings.EqualFold(src.Get("media_type").Str, "application/pdf") {
			return 0, false
		}
		data = src.Get("data").String()
	} else {
		url := part.Get("file_data").String()
		if url == "" {
			url = part.Get("file.file_data").String()
		}
		mediaType, payload, found := strings.Cut(strings.TrimPrefix(url, "data:"), ";base64,")
		if !found || !strings.EqualFold(mediaType, "application/pdf") {
			return 0, false
		}
		data = payload
	}
	pdf, err := base64.StdEncoding.DecodeString(strings.TrimRight(data, "="))
	if err != nil {
		if pdf, err = base64.RawStdEncoding.DecodeString(strings.TrimRight(data, "=")); err != nil {
			return 0, false
		}
	}
	pages := pdfPages(pdf)
	if pages == 0 {
		return 0, false
	}
	return min(maxEstimatedTokens, pages*tokensPerPDFPage), true
}

// pdfPages counts the page objects of a PDF (a dictionary of /Type /Page), those in the open
// and those packed into compressed object streams (/Type /ObjStm, as PDF 1.5 writers such as
// pdfTeX pack them). A page an incremental update rewrote counts twice: an estimate on the
// high side. 0 when none is found (not a PDF, or packed some other way).
//
// Linear in the PDF: the look for the next /ObjStm goes on past the stream just inflated (each
// /ObjStm looked from its own name for the next "stream", and a PDF of many of them before one
// stream scanned and inflated the rest of the PDF once each, quadratic), and one inflater and
// buffer serve every stream (a new inflater's setup, tens of KiB, for each of a 3 MiB PDF's
// streams that inflate to nothing took seconds of the estimate, before the call was admitted),
// and by the PDFs after it (inflaters): a body of 45 000 tiny PDFs allocated 3 GB so.
func pdfPages(pdf []byte) int64 {
	pages := countPageObjects(pdf)
	inf := inflaters.Get().(*inflater)
	defer inf.release()
	var inflated int64
	for rest := pdf; ; {
		i := indexName(rest, "/ObjStm")
		if i < 0 || inflated >= maxPDFInflated {
			return pages
		}
		rest = rest[i+len("/ObjStm"):]
		s := bytes.Index(rest, []byte("stream"))
		if s < 0 {
			return pages
		}
		body := rest[s+len("stream"):]
		body = bytes.TrimPrefix(body, []byte("\r"))
		body = bytes.TrimPrefix(body, []byte("\n"))
		objs, read := inf.inflate(body, maxPDFInflated-inflated)
		inflated += int64(len(objs))
		pages += countPageObjects(objs)
		rest = body[read:]
	}
}

// inflater inflates a PDF's streams, one at a time, with one zlib reader and buffer.
type inflater struct {
	zr  io.ReadCloser
	buf []byte
	out []byte
}

// inflaters keeps the inflaters PDFs were read with for the next ones.
var inflaters = sync.Pool{New: func() any { return new(inflater) }}

// release puts f back in inflaters, without an output buffer grown past the 32 KiB most
// object streams fit in (one may hold up to maxPDFInflated, kept for no later PDF).
func (f *inflater) release() {
	if cap(f.out) > 32<<10 {
		f.out = nil
	}
	inflaters.Put(f)
}

// inflate inflates the zlib stream at the start of compressed, up to limit bytes and
// maxInflateRatio bytes for each compressed byte read, and returns them (valid until the next
// inflate) and how many compressed bytes it read. A truncated or corrupt stream
// yields what inflated before the fault: the pages in it count.
func (f *inflater) inflate(compressed []byte, limit int64) (out []byte, read int64) {
	src := &countedReader{Reader: bytes.NewReader(compressed)}
	var err error
	if f.zr == nil {
		f.zr, err = zlib.NewReader(src)
	} else {
		err = f.zr.(zlib.Resetter).Reset(src, nil)
	}
	if err != nil { // a Reset that fails keeps the reader for the next (zlib's Reset)
		return nil, src.n
	}
	if f.buf == nil {
		f.buf = make([]byte, 32<<10)
	}
	f.out = f.out[:0]
	for int64(len(f.out)) < limit {
		n, err := f.zr.Read(f.buf[:min(int64(len(f.buf)), limit-int64(len(f.out)))])
		f.out = append(f.out, f.buf[:n]...)
		if err != nil || int64(len(f.out)) > maxInflateRatio*src.n {
			break
		}
	}
	return f.out, src.n
}

// countedReader counts the bytes read through it. A ByteReader, so that the inflater reads no
// further ahead than it needs: the count is what it consumed.
type countedReader struct {
	*bytes.Reader
	n int64
}

func (r *countedReader) Read(p []byte) (int, error) {
	n, err := r.Reader.Read(p)
	r.n += int64(n)
	return n, err
}

func (r *countedReader) ReadByte() (byte, error) {
	b, err := r.Reader.ReadByte()
	if err == nil {
		r.n++
	}
	return b, err
}

// countPageObjects counts "/Type /Page" in b (any whitespace between), not /Pages (a node of the
// page tree) nor any other name /Page starts.
func countPageObjects(b []byte) int64 {
	var n int64
	for {
		i := indexName(b, "/Type")
		if i < 0 {
			return n
		}
		b = bytes.TrimLeft(b[i+len("/Type"):], "\x00\t\n\f\r ")
		if bytes.HasPrefix(b, []byte("/Page")) && !nameContinues(b[len("/Page"):]) {
			n++
		}
	}
}

// indexName is the index of the PDF name in b, where it is not the start of a longer name;
// -1 when there is none.
func indexName(b []byte, name string) int {
	off := 0
	for {
		i := bytes.Index(b[off:], []byte(name))
		if i < 0 {
			return -1
		}
		if !nameContinues(b[off+i+len(name):]) {
			return off + i
		}
		off += i + len(name)
	}
}

// nameContinues reports whether rest, what follows a PDF name, goes on with more of the name:
// anything but whitespace and the delimiters ends one.
func nameContinues(rest []byte) bool {
	return len(rest) > 0 && !bytes.ContainsAny(rest[:1], "\x00\t\n\f\r ()<>[]{}/%")
}
