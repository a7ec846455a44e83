package admin

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/httpapi"
	"github.com/tollgate/tollgate/pricing"
)

func (h *handler) listGrants(w http.ResponseWriter, r *http.Request) {
	listUserPage(h, w, r, "a grant id", h.store.Grants,
		func(d holds.UserDetail, g holds.Grant) map[string]any { return h.views.Grant(d.Name, g, false) },
		func(g holds.Grant) any { return g.ID })
}

// createGrant credits (or, with a negative amount, debits) prepaid credits once per
// idempotency key: 201 when this request created the grant, 200 with the original grant for
// a repeat. The key may come in the body or, as payment webhooks often send it, in the
// Idempotency-Key header.
func (h *handler) createGrant(w http.ResponseWriter, r *http.Request) {
	d, ok := h.user(w, r)
	if !ok {
		return
	}
	var req struct {
		Amount         json.RawMessage `json:"amount"` // credits, decimal; negative for a refund
		IdempotencyKey string          `json:"idempotency_key"`
		Reason         string          `json:"reason"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	if len(r.Header.Values("Idempotency-Key")) > 1 {
		// Read as its first line, a grant whose first line was empty was taken without the
		// key its retry would name, and paid twice. Refused whether or not the body names a
		// key, as the model API refuses it.
		writeError(w, badRequest("invalid_request", "Idempotency-Key must be sent once: this request sends it on more than one line."))
		return
	}
	if req.IdempotencyKey == "" {
		req.IdempotencyKey = r.Header.Get("Idempotency-Key")
	}
	// encoding/json decodes bytes that are not UTF-8, and escaped unpaired surrogates, to
	// U+FFFD without an error: two different keys would arrive as one, and the second payment
	// would be answered as a replay of the first, never credited. Keys are compared byte for
	// byte, so one that cannot be told apart from another is refused.
	if strings.ContainsRune(req.IdempotencyKey, utf8.RuneError) {
		writeError(w, badRequest("invalid_request", "idempotency_key must be UTF-8 text without U+FFFD (what bytes that are not UTF-8, or unpaired surrogates, decode to): two different keys would be one grant"))
		return
	}
	amount, err := parseAmount(req.Amount, h.views.CreditMicro)
	if err != nil {
		writeError(w, badRequest("invalid_amount", "amount must be a decimal number of credits, e.g. \"12.5\" or \"-3\": "+err.Error()))
		return
	}
	if amount == 0 {
		// Refused by the store too (ErrGrantInvalid), whose code is the one of a bad key: what
		// is wrong here is the amount, and scripts tell the two apart by their codes.
		writeError(w, badRequest("invalid_amount", "amount must not be zero: a grant of 0 credits credits nothing"))
		return
	}
	g, created, err := h.store.Grant(r.Context(), holds.GrantRequest{UserID: d.ID, AmountMicro: amount,
		IdempotencyKey: req.IdempotencyKey, Reason: req.Reason})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	httpapi.WriteJSON(w, status, h.views.Grant(d.Name, g, !created))
}

// parseAmount reads an amount of credits, a JSON number or a string holding one: a grant's,
// and a PATCH's allowance. It is decoded here rather than into a json.Number by readJSON: a
// string holding no number ("12,50", "") or a value of another type failed the whole body as
// invalid_json, in encoding/json's words, where invalid_amount says what an amount must be.
func parseAmount(raw json.RawMessage, creditMicro int64) (int64, error) {
	var n json.Number // absent or null: "", refused by ParseCredits
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &n); err != nil {
			return 0, fmt.Errorf("%w: not a number, nor a string holding one", pricing.ErrBadCredits)
		}
	}
	return pricing.ParseCredits(n.String(), creditMicro)
}

func (h *handler) balance(w http.ResponseWriter, r *http.Request) {
	d, ok := h.user(w, r)
	if !ok {
		return
	}
	b, err := h.store.Balance(r.Context(), d.ID)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, h.views.Balance(d, b))
}
