package proxy

import (
	"compress/gzip"
	"io"
	"net/http"
	"strings"
)

// gunzipping asks the upstream for gzip and decodes an answer that comes in gzip alone.
//
// net/http's transport does this itself, but reads only the first Content-Encoding line: an
// answer labelled gzip twice, on two lines (a compressing proxy in front of a server that
// compressed already; RFC 9110 §5.3 reads the lines as one list), was decoded once and its
// label dropped, and the meter was handed gzip; one labelled identity, then br, was not decoded
// at all and passed for plain. Here every line counts: an answer in anything but one gzip
// keeps its Content-Encoding, and unaskedEncoding refuses it. x-gzip is gzip under its older
// name (RFC 9110 §8.4.1.3: a recipient should read it as gzip), decoded as such: refused, an
// answer the gateway could read was charged as one it could not.
type gunzipping struct{ base http.RoundTripper }

func (g gunzipping) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := g.base.RoundTrip(req)
	if err != nil || req.Header.Get("Accept-Encoding") != "gzip" {
		return resp, err
	}
	if codings := contentCodings(resp.Header); len(codings) == 1 && isGzip(codings[0]) {
		resp.Body = &gzipBody{body: resp.Body}
		resp.Header.Del("Content-Encoding")
		resp.Header.Del("Content-Length")
		resp.ContentLength = -1
		resp.Uncompressed = true
	}
	return resp, nil
}

// isGzip reports whether coding names gzip: as itself or as x-gzip, in any case.
func isGzip(coding string) bool {
	return strings.EqualFold(coding, "gzip") || strings.EqualFold(coding, "x-gzip")
}

// contentCodings lists the codings h's Content-Encoding lines name, identity left out.
func contentCodings(h http.Header) []string {
	var codings []string
	for _, v := range h.Values("Content-Encoding") {
		for _, c := range strings.Split(v, ",") {
			if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
				codings = append(codings, c)
			}
		}
	}
	return codings
}

// unaskedEncoding is the Content-Encoding of an answer that gunzipping did not decode (every
// line of it, comma-joined), or "" when the answer is plain.
func unaskedEncoding(h http.Header) string {
	if len(contentCodings(h)) == 0 {
		return ""
	}
	return strings.Join(h.Values("Content-Encoding"), ", ")
}

// gzipBody decodes a gzip body from its first Read: gzip.NewReader reads the header, and a
// stream's headers go to the caller before its first byte comes.
type gzipBody struct {
	body io.ReadCloser
	zr   *gzip.Reader
	err  error
}

func (b *gzipBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.zr == nil {
		if b.zr, b.err = gzip.NewReader(b.body); b.err != nil {
			return 0, b.err
		}
	}
	n, err := b.zr.Read(p)
	if err != nil {
		b.err = err
	}
	return n, err
}

func (b *gzipBody) Close() error { return b.body.Close() }
