package admin

import (
	"fmt"
	"net/http"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/httpapi"
	"go.uber.org/zap"
)

func (h *handler) listRuns(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := holds.RunFilter{State: holds.State(q.Get("state")), After: q.Get("after")}
	var bad *apiError
	if f.Limit, bad = limitParam(r); bad != nil {
		writeError(w, bad)
		return
	}
	var err error
	if f.Since, err = ParseTime(q.Get("since")); err != nil {
		writeError(w, badRequest("invalid_since", err.Error()))
		return
	}
	if f.Until, err = ParseTime(q.Get("until")); err != nil {
		writeError(w, badRequest("invalid_until", err.Error()))
		return
	}
	if f.SettledSince, err = ParseTime(q.Get("settled_since")); err != nil {
		writeError(w, badRequest("invalid_settled_since", err.Error()))
		return
	}
	if f.SettledUntil, err = ParseTime(q.Get("settled_until")); err != nil {
		writeError(w, badRequest("invalid_settled_until", err.Error()))
		return
	}
	if name := q.Get("user"); name != "" {
		d, err := h.store.UserDetail(r.Context(), name)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		f.UserID = d.ID
	}
	limit := f.Limit
	f.Limit++ // one more: whether it comes is has_more
	runs, err := h.store.ListRuns(r.Context(), f)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	// The cursor of the next page: ?after=<last_id>, with the same filters. It holds the last
	// run's position, so the run may be pruned before the next page is asked for.
	httpapi.WriteJSON(w, http.StatusOK, List(runs, limit, h.views.Run, func(run holds.UserRun) any { return f.Cursor(run.Run) }))
}

// usageReport answers GET /reports/usage?from=YYYY-MM-DD&to=YYYY-MM-DD[&user=][&format=csv].
// Days are UTC days of settlement, as in the day ledger; both ends are inclusive and default
// to today by the database's clock, the ledger's.
func (h *handler) usageReport(w http.ResponseWriter, r *http.Request) {
	select {
	case h.reports <- struct{}{}:
		defer func() { <-h.reports }()
	default:
		writeError(w, &apiError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "reports_busy",
			Message: fmt.Sprintf("%d usage reports are being built; retry shortly.", maxReportsAtOnce), RetryAfter: reportRetryAfter})
		return
	}
	q := r.URL.Query()
	var today time.Time
	if q.Get("from") == "" || q.Get("to") == "" {
		var err error
		if today, err = h.store.Today(r.Context()); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	from, err := dateParam(q.Get("from"), today)
	if err != nil {
		writeError(w, badRequest("invalid_from", err.Error()))
		return
	}
	to, err := dateParam(q.Get("to"), today)
	if err != nil {
		writeError(w, badRequest("invalid_to", err.Error()))
		return
	}
	format := q.Get("format")
	if format != "" && format != "json" && format != "csv" {
		writeError(w, badRequest("invalid_format", "format must be json or csv"))
		return
	}
	var userID uint64
	if name := q.Get("user"); name != "" {
		d, err := h.store.UserDetail(r.Context(), name)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		userID = d.ID
	}
	rep, err := h.store.Usage(r.Context(), from, to, userID)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if format == "csv" {
		w.Header().Set("Content-Type", "text/csv; charset=utf-8")
		w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=\"usage_%s_%s.csv\"", rep.From, rep.To))
		w.WriteHeader(http.StatusOK)
		if err := h.views.WriteReportCSV(w, rep); err != nil {
			h.log.Warn("admin: writing CSV report", zap.Error(err))
		}
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, h.views.Report(rep))
}
