package proxy

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/httpapi"
)

type userKey struct{}

// userFrom returns the authenticated user of a request.
func userFrom(ctx context.Context) holds.User {
	u, ok := ctx.Value(userKey{}).(holds.User)
	if !ok {
		panic("proxy: handler reached without authentication")
	}
	return u
}

// authenticate resolves the caller's key to a user. Anthropic clients send `x-api-key`, so
// the routes they call accept it too (xAPIKeyRoute).
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name := repeatedKeyHeader(r); name != "" {
			s.refuseUnknownCaller(w, r, errBadRequest("invalid_authorization",
				name+" must be sent once: this request sends it on more than one line."), name+" sent twice", nil)
			return
		}
		key := callerKey(r)
		if key == "" {
			s.refuseUnknownCaller(w, r, errBadKey, "no key", nil)
			return
		}
		looking := time.Now()
		u, err := s.auth.lookup(r.Context(), key)
		s.metrics.authPhase.Observe(time.Since(looking).Seconds())
		if errors.Is(err, holds.ErrBadKey) {
			s.refuseUnknownCaller(w, r, errBadKey, "unknown key", nil)
			return
		}
		if err != nil {
			s.refuseUnknownCaller(w, r, errBillingDown, "key lookup failed", err)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, u)))
	})
}

// repeatedKeyHeader is the name of a header a key is read from (callerKey) that r sends on
// more than one line, or "". Neither is a list (RFC 9110 §5.3), and only the first line was
// read: a caller whose proxy added its own Authorization line before the caller's was charged
// to the proxy's key, one whose first line was empty was refused as keyless. x-api-key is
// checked only where it is read (xAPIKeyRoute).
func repeatedKeyHeader(r *http.Request) string {
	if len(r.Header.Values("Authorization")) > 1 {
		return "Authorization"
	}
	if xAPIKeyRoute(r.URL.Path) && len(r.Header.Values("X-Api-Key")) > 1 {
		return "x-api-key"
	}
	return ""
}

// callerKey is the key a request authenticates with: its Bearer credentials, else, on the
// routes Anthropic's clients call (xAPIKeyRoute), its x-api-key. "" when it sends none.
func callerKey(r *http.Request) string {
	key, ok := httpapi.BearerCredentials(r.Header.Get("Authorization"))
	if !ok && xAPIKeyRoute(r.URL.Path) {
		key = strings.TrimSpace(r.Header.Get("x-api-key"))
	}
	return key
}

// keyStillLive looks the key of a call authenticated as user up again, once its body has been
// read whole and before anything is held for it: an answer to refuse it with, else nil. The key
// was looked up when the request's headers arrived, and a body may take minutes more (it is cut
// only below minBodyRate on average); a key revoked meanwhile had its call admitted, forwarded
// and charged to its user, past the key_cache_ttl within which README promises a revoked key is
// refused (a disabled user is refused by admission itself, under the user's row lock). Within
// key_cache_ttl of the first lookup this one is answered by the cache; past it, a body that
// took that long costs one more lookup in the store.
func (s *Server) keyStillLive(r *http.Request, user holds.User) (e *apiError, reason string, err error) {
	u, err := s.auth.lookup(r.Context(), callerKey(r))
	switch {
	case errors.Is(err, holds.ErrBadKey):
		return errBadKey, "key refused once the body was read (revoked meanwhile)", nil
	case err != nil:
		return errBillingDown, "key lookup after the body failed", err
	case u.ID != user.ID:
		// A key never changes hands: a store that says otherwise is not to be charged by.
		return errBadKey, "key names another user once the body was read", nil
	}
	return nil, "", nil
}

// xAPIKeyRoute reports whether a key may come in x-api-key on path: the routes Anthropic's
// clients call with their key there, /v1/messages, its token counter, and the models list and
// lookup (models.list, models.retrieve: a client checks its model there before it calls it;
// refused, a valid key was told it was invalid). The OpenAI-shaped routes and the gateway's own
// take a Bearer key only (DESIGN §3).
func xAPIKeyRoute(path string) bool {
	return path == anthropicPath || path == countTokensPath || path == modelsPath || strings.HasPrefix(path, modelsPath+"/")
}

// refuseUnknownCaller answers a request refused before its caller is known, writes its one line
// (never the key it sent) and, on a route counted in tollgate_requests_total, counts it there
// as the route's other refusals are: a flood of wrong keys is seen in both. The route is quoted
// up to maxLoggedBytes: /v1/models/* and /v1/runs/{id} take any path, and a stranger's 64 KiB
// path made a 64 KiB line.
func (s *Server) refuseUnknownCaller(w http.ResponseWriter, r *http.Request, e *apiError, reason string, err error) {
	logRefusal(s.log, e, reason, err, zap.String("route", logged(r.URL.Path)), zap.String("remote", r.RemoteAddr))
	writeError(w, e)
	if countedRoute(r.URL.Path) {
		s.metrics.Requests.WithLabelValues(r.URL.Path, codeLabel(e.Status)).Inc()
	}
}

// countedRoute reports whether path is one of the paths tollgate_requests_total is labelled
// with: the model routes (routes) and the token counter.
func countedRoute(path string) bool {
	if path == countTokensPath {
		return true
	}
	for _, rt := range routes {
		if rt.path == path {
			return true
		}
	}
	return false
}

// keyCache keeps key lookups for a few seconds: a hot caller does not pay a MySQL round trip
// per request, and a revoked key or disabled user is refused within ttl (admission also
// refuses a disabled user under its row lock, with no delay at all).
//
// It keeps the store's refusals for ttl too, apart: a client left with a revoked key (a
// rotated secret in a forgotten job, an agent retrying on 401) cost a database query per
// request, beside the admissions, for as long as it kept trying; now one per ttl. The price
// is the mirror of a revocation's delay: a user enabled again is refused for up to ttl more
// by a process that refused them just before. A key never issued cannot be refused before its
// creation by anyone but a guesser, so a new key works at once. Refusals have their own bound,
// so a flood of made-up keys starts over their map, never the accepted keys' one; a key not
// of the shape tollgate issues is refused without the store and kept nowhere.
type keyCache struct {
	lookups *holds.KeyLookup // groups concurrent misses into one query
	ttl     time.Duration

	mu         sync.Mutex
	entries    map[[32]byte]cachedUser
	refused    map[[32]byte]time.Time // a refused key's hash -> when its refusal ends
	maxRefused int                    // maxRefusedKeys; tests set less

	// observe, set by tests only (nil otherwise), is told of each lookup whether the cache
	// answered it: a test that relies on a key still being cached can check that it was.
	observe atomic.Pointer[func(hit bool)]
}

type cachedUser struct {
	user    holds.User
	expires time.Time
}

// maxCachedKeys bounds the cache of accepted keys and maxRefusedKeys that of refused ones;
// past either, that map starts over.
const (
	maxCachedKeys  = 100_000
	maxRefusedKeys = 10_000
)

func newKeyCache(store *holds.Store, ttl time.Duration) *keyCache {
	return &keyCache{lookups: holds.NewKeyLookup(store, holds.BatcherConfig{Workers: batchWorkers, Timeout: keyLookupTimeout}),
		ttl: ttl, entries: map[[32]byte]cachedUser{}, refused: map[[32]byte]time.Time{}, maxRefused: maxRefusedKeys}
}

// keyLookupTimeout bounds a caller's key lookup, its wait for a place in the queue and for a
// worker included, and one batch of lookups; past it the caller gets 503.
const keyLookupTimeout = 5 * time.Second

func (c *keyCache) lookup(ctx context.Context, key string) (holds.User, error) {
	if !holds.WellFormedKey(key) {
		return holds.User{}, holds.ErrBadKey
	}
	hash := holds.HashKey(key)
	now := time.Now()
	c.mu.Lock()
	e, ok := c.entries[hash]
	refusedUntil, wasRefused := c.refused[hash]
	c.mu.Unlock()
	hit := ok && now.Before(e.expires)
	refused := !hit && wasRefused && now.Before(refusedUntil)
	if f := c.observe.Load(); f != nil {
		(*f)(hit || refused)
	}
	if hit {
		return e.user, nil
	}
	if refused {
		return holds.User{}, holds.ErrBadKey
	}
	// The batch's own timeout bounds the query, not the wait before it: with the database
	// stalled, a lookup queued behind busy batches waited for them and then for its own.
	lctx, cancel := context.WithTimeout(ctx, keyLookupTimeout)
	u, err := c.lookups.User(lctx, key)
	cancel()
	if errors.Is(err, holds.ErrBadKey) {
		c.mu.Lock()
		if len(c.refused) >= c.maxRefused {
			clear(c.refused)
		}
		c.refused[hash] = now.Add(c.ttl)
		c.mu.Unlock()
	}
	if err != nil {
		return holds.User{}, err // a store that failed is asked again by the next request
	}
	c.mu.Lock()
	if len(c.entries) >= maxCachedKeys {
		clear(c.entries)
	}
	c.entries[hash] = cachedUser{user: u, expires: now.Add(c.ttl)}
	delete(c.refused, hash)
	c.mu.Unlock()
	return u, nil
}
