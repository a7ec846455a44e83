package admin

import (
	"net/http"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/httpapi"
)

// listInstances pages the gateway processes' rows (holds.Instance), newest start first: which
// processes beat now, which went silent, which a reconciler found dead and when, so that an
// operator can tell a process that died from one that was shut down.
func (h *handler) listInstances(w http.ResponseWriter, r *http.Request) {
	limit, bad := limitParam(r)
	if bad != nil {
		writeError(w, bad)
		return
	}
	rows, err := h.store.ListInstances(r.Context(), r.URL.Query().Get("after"), limit+1)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, List(rows, limit, h.views.Instance, func(in holds.InstanceRow) any { return in.ID }))
}
