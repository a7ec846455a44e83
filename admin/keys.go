package admin

import (
	"net/http"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/httpapi"
	"go.uber.org/zap"
)

func (h *handler) listKeys(w http.ResponseWriter, r *http.Request) {
	listUserPage(h, w, r, "a key id", h.store.ListKeys,
		func(_ holds.UserDetail, k holds.KeyInfo) map[string]any { return h.views.Key(k) },
		func(k holds.KeyInfo) any { return k.ID })
}

// createKey issues a key and shows it this once: only its hash is stored.
func (h *handler) createKey(w http.ResponseWriter, r *http.Request) {
	d, ok := h.user(w, r)
	if !ok {
		return
	}
	key, err := h.store.CreateKey(r.Context(), d.ID)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.log.Info("admin: key created", zap.String("user", d.Name), zap.String("prefix", holds.ShownPrefix(key)))
	httpapi.WriteJSON(w, http.StatusCreated, map[string]any{"object": "api_key", "user": d.Name, "key": key, "prefix": holds.ShownPrefix(key),
		"note": "This is the only time the key is shown; store it now."})
}

// revokeKey revokes the key given in full. Refused at once by the store; a proxy that looked
// the key up in the last key_cache_ttl (2 s by default) may still accept it until its cached
// entry ends.
func (h *handler) revokeKey(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Key string `json:"key"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	if req.Key == "" {
		writeError(w, badRequest("missing_key", "send {\"key\": \"tg_...\"}"))
		return
	}
	user, err := h.store.RevokeAPIKey(r.Context(), req.Key)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"object": "api_key", "revoked": true, "user": user, "prefix": holds.ShownPrefix(req.Key)})
}

// revokeUserKeys revokes a user's keys by the prefix lists show, for when the key is lost. Its
// answer has the whole-key revoke's shape ("revoked": true, as a key's view has it) and says
// how many live keys carried the prefix in "keys_revoked": two of a user's keys can share one.
func (h *handler) revokeUserKeys(w http.ResponseWriter, r *http.Request) {
	d, ok := h.user(w, r)
	if !ok {
		return
	}
	var req struct {
		Prefix string `json:"prefix"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	n, err := h.store.RevokeKeysByPrefix(r.Context(), d.ID, req.Prefix)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"object": "api_key", "user": d.Name, "prefix": req.Prefix, "revoked": true, "keys_revoked": n})
}
