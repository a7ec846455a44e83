// Package fakellm is a deterministic OpenAI- and Anthropic-compatible upstream.
//
// tollgate bills what an upstream reports, so its tests need an upstream whose
// every answer is known in advance: how many tokens a prompt costs
// ([PromptTokens]), how many it answers with ([CompletionTokens]), and which of
// the failure modes real providers show (no usage, usage on every chunk, an error
// mid-stream, a dropped connection, an error status) it takes. Each of those is
// chosen per request by an X-Fake-* header, so one server can serve a whole test
// suite or benchmark in parallel. The same bytes come back for the same request:
// ids are derived from the body and the creation time is fixed.
package fakellm

import (
	"crypto/subtle"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
)

// DefaultChunks is the number of content chunks (and so output tokens) of an
// answer when neither Config.Chunks nor X-Fake-Chunks says otherwise.
const DefaultChunks = 8

// maxBody bounds what one request may make the server hold in memory.
const maxBody = 16 << 20

// Config is the server-wide default of every knob; request headers override it.
type Config struct {
	Latency       time.Duration // before the first byte (default 0)
	Chunks        int           // content chunks per streamed answer (0 = DefaultChunks)
	ChunkInterval time.Duration // pause between chunks (default 0)
	FixturesDir   string        // directory of recorded responses for replay ("" = replay disabled)
	// APIKey, when non-empty, is required as `Authorization: Bearer <key>` on the
	// OpenAI routes and as `x-api-key: <key>` on /v1/messages, so tests can tell
	// the gateway's provider key from the caller's key.
	APIKey string
}

// Server is an http.Handler. It keeps no state but the call counter and a
// cache of fixture files, so one Server can be shared by any number of tests.
type Server struct {
	cfg      Config
	calls    atomic.Int64
	fixtures sync.Map // fixture base name -> []byte; files are read once
	bufs     sync.Pool
}

// New returns a Server; a zero Config is a valid, instant upstream.
func New(cfg Config) *Server {
	if cfg.Chunks <= 0 {
		cfg.Chunks = DefaultChunks
	}
	s := &Server{cfg: cfg}
	s.bufs.New = func() any { b := make([]byte, 0, 4096); return &b }
	return s
}

// Calls counts model requests, each once on arrival, whatever became of it:
// a test that expects the gateway to collapse duplicates into one upstream
// call must see failed and refused attempts too.
func (s *Server) Calls() int64 { return s.calls.Load() }

// ResetCalls sets the call counter back to zero.
func (s *Server) ResetCalls() { s.calls.Store(0) }

type route int

const (
	routeChat route = iota
	routeCompletions
	routeEmbeddings
	routeResponses
	routeMessages
)

// ServeHTTP dispatches on the exact path: the route set is fixed and small, and
// a switch costs nothing on the benchmark's hot path.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var rt route
	switch r.URL.Path {
	case "/v1/chat/completions":
		rt = routeChat
	case "/v1/completions":
		rt = routeCompletions
	case "/v1/embeddings":
		rt = routeEmbeddings
	case "/v1/responses":
		rt = routeResponses
	case "/v1/messages":
		rt = routeMessages
	case "/v1/messages/count_tokens":
		s.countTokens(w, r)
		return
	case "/v1/models":
		s.models(w, r)
		return
	case "/healthz":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
		return
	case "/stats":
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"calls":` + strconv.FormatInt(s.Calls(), 10) + "}\n"))
		return
	default:
		writeError(w, http.StatusNotFound, false, "not_found_error", "unknown route "+r.URL.Path)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, rt == routeMessages, "invalid_request_error", "use POST")
		return
	}
	s.calls.Add(1)
	s.serveModel(w, r, rt)
}

func (s *Server) serveModel(w http.ResponseWriter, r *http.Request, rt route) {
	anth := rt == routeMessages
	k, err := parseKnobs(r.Header, &s.cfg)
	if err != nil {
		writeError(w, http.StatusBadRequest, anth, "invalid_request_error", err.Error())
		return
	}
	// The body is read before any pause: net/http notices a client hanging
	// up (and cancels r.Context()) only once the body has been consumed.
	body, status, err := readBody(w, r)
	if err != nil {
		writeError(w, status, anth, "invalid_request_error", err.Error())
		return
	}
	if !sleep(r.Context(), k.latency) {
		return
	}
	if !s.authorized(r, anth) {
		writeError(w, http.StatusUnauthorized, anth, "authentication_error", "invalid api key")
		return
	}
	if anth && r.Header.Get("anthropic-version") == "" {
		writeError(w, http.StatusBadRequest, true, "invalid_request_error", "anthropic-version: header is required")
		return
	}
	if k.status != 0 {
		if k.status == http.StatusTooManyRequests || k.status == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "1")
		}
		writeError(w, k.status, anth, statusType(k.status, anth), "fake upstream status "+strconv.Itoa(k.status))
		return
	}
	if k.replay != "" {
		s.replay(w, r, &k)
		return
	}

	ans, stream, err := newAnswer(rt, body, &k)
	if err != nil {
		writeError(w, http.StatusBadRequest, anth, "invalid_request_error", err.Error())
		return
	}
	bp := s.bufs.Get().(*[]byte)
	defer func() {
		// A rare huge answer (thousands of embeddings) is not kept alive.
		if cap(*bp) <= 64<<10 {
			*bp = (*bp)[:0]
			s.bufs.Put(bp)
		}
	}()
	if sa, ok := ans.(streamAnswer); ok && stream {
		*bp = s.stream(w, r, &k, sa, *bp)
		sleep(r.Context(), k.linger) // a stream whose end comes some time after its last event
	} else {
		*bp = s.whole(w, r, &k, ans, anth, *bp)
	}
}

// countTokens answers Anthropic's token counter with the prompt tokens a call of the same body
// would report. It is not a model call (Calls does not count it): the provider does not bill it.
func (s *Server) countTokens(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, true, "invalid_request_error", "use POST")
		return
	}
	body, status, err := readBody(w, r)
	if err != nil {
		writeError(w, status, true, "invalid_request_error", err.Error())
		return
	}
	if !s.authorized(r, true) {
		writeError(w, http.StatusUnauthorized, true, "authentication_error", "invalid api key")
		return
	}
	if r.Header.Get("anthropic-version") == "" {
		writeError(w, http.StatusBadRequest, true, "invalid_request_error", "anthropic-version: header is required")
		return
	}
	if !gjson.ValidBytes(body) || !gjson.GetBytes(body, "model").Exists() {
		writeError(w, http.StatusBadRequest, true, "invalid_request_error", "a JSON body with a model is required")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"input_tokens":` + strconv.FormatInt(PromptTokens(body), 10) + "}"))
}

// authorized reports whether r carries the configured key (x-api-key on Anthropic's routes, a
// Bearer token on the others), compared in constant time: the fake is sometimes exposed on a
// shared host during demos, and doing it right costs nothing.
func (s *Server) authorized(r *http.Request, anth bool) bool {
	if s.cfg.APIKey == "" {
		return true
	}
	var got string
	if anth {
		got = r.Header.Get("X-Api-Key")
	} else {
		const p = "Bearer "
		h := r.Header.Get("Authorization")
		if len(h) <= len(p) || h[:len(p)] != p {
			return false
		}
		got = h[len(p):]
	}
	return subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.APIKey)) == 1
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		writeError(w, http.StatusMethodNotAllowed, false, "invalid_request_error", "use GET")
		return
	}
	// Either credential style is accepted: both OpenAI and Anthropic list
	// models at this path.
	if !s.authorized(r, false) && !s.authorized(r, true) {
		writeError(w, http.StatusUnauthorized, false, "authentication_error", "invalid api key")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(modelsBody))
}

// modelsBody is cosmetic: every model name is served; these are the names the
// demo configuration prices.
const modelsBody = `{"object":"list","data":[{"id":"fake-model","object":"model","created":1700000000,"owned_by":"fakellm"},{"id":"gpt-4o","object":"model","created":1700000000,"owned_by":"fakellm"},{"id":"gpt-4o-mini","object":"model","created":1700000000,"owned_by":"fakellm"},{"id":"gpt-5","object":"model","created":1700000000,"owned_by":"fakellm"},{"id":"text-embedding-3-small","object":"model","created":1700000000,"owned_by":"fakellm"},{"id":"claude-sonnet-4-5","object":"model","created":1700000000,"owned_by":"fakellm"}]}` + "\n"
