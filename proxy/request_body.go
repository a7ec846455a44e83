package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/tollgate/tollgate/internal/httpapi"
)

// Reading a request's body: its size, its pace and its encoding.

// readBody reads at most limit bytes; past it the request is refused with 413 before
// anything is held. A body that stops arriving for stall (at least half of it), or that
// arrives slower than minBodyRate on average once stall has passed, is refused with 408: the
// server sets no read timeout, and without this a caller could hold a connection and its body
// buffer for as long as it liked. The body counts against lease (bodyMemory) — all its
// Content-Length at once, before any of it is read, else as it is read — and one that does
// not fit is refused 503 or 429. A Content-Length over limit is refused 413 first, before
// anything is read: no caller is told to retry (429) what can never fit, nor told by a 100
// Continue to send a body that will be refused.
func readBody(w http.ResponseWriter, r *http.Request, limit int64, stall time.Duration, lease *bodyLease) ([]byte, *apiError) {
	if r.ContentLength > limit {
		w.Header().Set("Connection", "close")
		return nil, errBodyTooLarge(limit)
	}
	if r.ContentLength > 0 {
		if err := lease.reserve(r.ContentLength); err != nil {
			w.Header().Set("Connection", "close")
			return nil, bodyMemoryError(err)
		}
	}
	rc := http.NewResponseController(w)
	sr := &stallReader{r: lease.reader(http.MaxBytesReader(nil, r.Body, limit)), rc: rc, timeout: stall}
	body, err := io.ReadAll(sr)
	// Lifted at once: a deadline left on the connection would end the server's background
	// read, which cancels the request's context, in the middle of the call.
	_ = rc.SetReadDeadline(time.Time{})
	if err != nil {
		// What is left of the body is not read: without this the server would drain it
		// (up to 256 KiB, with no deadline) before sending the answer, and a caller that
		// stalls there, even past the size limit, would hold the connection for good.
		w.Header().Set("Connection", "close")
	}
	if aerr := bodyMemoryError(err); aerr != nil {
		return nil, aerr
	}
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return nil, errBodyTooLarge(limit)
	}
	var ne interface{ Timeout() bool }
	if errors.As(err, &ne) && ne.Timeout() {
		return nil, &apiError{Status: http.StatusRequestTimeout, Type: "invalid_request_error", Code: "request_timeout",
			Message: "The request body stopped arriving."}
	}
	if err != nil {
		return nil, errBadRequest("unreadable_body", "Could not read the request body: "+err.Error())
	}
	return body, nil
}

func errBodyTooLarge(limit int64) *apiError {
	return &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
		Message: fmt.Sprintf("Request body is larger than the limit of %d bytes.", limit)}
}

// stallReader moves the connection's read deadline forward as the body arrives, only once
// half of it has passed (each move resets a runtime timer): a read fails after between half
// the timeout and the whole of it without progress.
type stallReader struct {
	r       io.Reader
	rc      *http.ResponseController
	timeout time.Duration
	start   time.Time // the first Read
	read    int64
	// deadline is the read deadline set on the connection, zero before the first Read.
	deadline time.Time
}

// minBodyRate is the slowest a body may arrive, on average, once its first stall window has
// passed: a caller that trickles a byte now and then never stalls, and held a connection, its
// goroutine and a growing buffer for as long as it liked. At this pace the largest body allowed
// takes limits.max_body_bytes / 1 KiB seconds (an hour for 4 MiB), a bound however it is sent.
const minBodyRate = 1 << 10 // bytes per second

func (s *stallReader) Read(p []byte) (int, error) {
	if now := time.Now(); s.timeout > 0 && s.deadline.Sub(now) < s.timeout/2 {
		if s.start.IsZero() {
			s.start = now
		}
		// Moved only when less than half the window is left, so a body that arrives at pace
		// costs a deadline every half window, not one a Read.
		d := now.Add(s.timeout)
		if byRate := s.start.Add(s.timeout + time.Duration(s.read)*(time.Second/minBodyRate)); byRate.Before(d) {
			d = byRate // in the past when the body is already behind: the Read fails at once
		}
		_ = s.rc.SetReadDeadline(d)
		s.deadline = d
	}
	n, err := s.r.Read(p)
	s.read += int64(n)
	return n, err
}

// checkContentEncoding refuses a body sent compressed (Content-Encoding other than identity):
// the gateway reads, meters and forwards the body as it arrives, so a compressed one would be
// refused as invalid JSON, and a plain one under such a label would reach the upstream with a
// header telling it to decompress what the gateway metered as plain.
func checkContentEncoding(h http.Header) *apiError {
	if ce, ok := httpapi.ContentEncoding(h); ok {
		return &apiError{Status: http.StatusUnsupportedMediaType, Type: "invalid_request_error", Code: "unsupported_content_encoding",
			Message: fmt.Sprintf("Request bodies sent with Content-Encoding %q are not supported; send the JSON uncompressed.", quotedValue(ce))}
	}
	return nil
}
