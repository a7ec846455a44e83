package fakellm

import (
	"errors"
	"io/fs"
	"net/http"
	"os"
	"strings"
)

// replay sends a recorded provider response byte for byte, so the gateway's
// metering is tested against what providers really send, and X-Fake-Split cuts
// it where a TCP read might: inside an event, a UTF-8 rune or a JSON number.
// X-Fake-Drop-After counts writes here; X-Fake-Error-After does not apply.
func (s *Server) replay(w http.ResponseWriter, r *http.Request, k *knobs) {
	anth := r.URL.Path == "/v1/messages"
	data, status, err := s.fixture(k.replay)
	if err != nil {
		writeError(w, status, anth, statusType(status, anth), err.Error())
		return
	}
	h := w.Header()
	if strings.HasSuffix(k.replay, ".json") {
		h.Set("Content-Type", "application/json")
	} else if strings.HasSuffix(k.replay, ".sse") {
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
	} else {
		h.Set("Content-Type", "application/octet-stream")
	}
	w.WriteHeader(http.StatusOK)

	e := &emitter{w: w, rc: http.NewResponseController(w), ok: true}
	ends := make([]int, 0, len(k.splits)+1)
	for _, off := range k.splits {
		if off > 0 && off < len(data) {
			ends = append(ends, off)
		}
	}
	ends = append(ends, len(data))
	start := 0
	for i, end := range ends {
		if i > 0 && !sleep(r.Context(), k.interval) {
			return
		}
		if i == k.dropAfter {
			panic(http.ErrAbortHandler)
		}
		if !e.write(data[start:end]) {
			return
		}
		start = end
	}
	if k.dropAfter >= len(ends) {
		panic(http.ErrAbortHandler)
	}
}

// fixture reads a fixture once and keeps it: replay serves benchmarks too.
// Only a base name is accepted, and os.Root refuses what still escapes the
// directory (a symlink pointing out), so a request header cannot read files.
func (s *Server) fixture(name string) ([]byte, int, error) {
	if s.cfg.FixturesDir == "" {
		return nil, http.StatusBadRequest, errors.New(HeaderReplay + ": replay is disabled (no fixtures directory)")
	}
	if name == "." || name == ".." || strings.ContainsAny(name, "/\\\x00") {
		return nil, http.StatusBadRequest, errors.New(HeaderReplay + ": want a file name inside the fixtures directory")
	}
	if v, ok := s.fixtures.Load(name); ok {
		return v.([]byte), 0, nil
	}
	root, err := os.OpenRoot(s.cfg.FixturesDir)
	if err != nil {
		return nil, http.StatusInternalServerError, errors.New("opening fixtures directory: " + err.Error())
	}
	defer root.Close()
	data, err := root.ReadFile(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, http.StatusNotFound, errors.New(HeaderReplay + ": no fixture " + name)
	case err != nil:
		return nil, http.StatusBadRequest, errors.New(HeaderReplay + ": cannot read fixture " + name + ": " + err.Error())
	}
	v, _ := s.fixtures.LoadOrStore(name, data)
	return v.([]byte), 0, nil
}
