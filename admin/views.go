package admin

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// Views turns store records into what the admin API answers and the gateway's subcommands
// print, so both show the same fields. Money is shown in credits as exact decimals (JSON
// numbers such as 12.5, never a rounded float).
type Views struct {
	CreditMicro int64
}

// Credits shows micro-USD as a JSON number of credits.
func (v Views) Credits(micro int64) json.Number {
	return json.Number(pricing.FormatCredits(micro, v.CreditMicro))
}

// List is one page of a listing as the API answers it and the subcommands print it. rows were
// read with one row more than limit asked for: that row, when it came, is left out and says
// has_more, so the last page says has_more false even when it is full. last_id, the cursor
// of the next page (?after=, -after), is cursor of the page's last row; a page with no rows
// has none.
func List[T any](rows []T, limit int, view func(T) map[string]any, cursor func(T) any) map[string]any {
	more := len(rows) > limit
	if more {
		rows = rows[:limit]
	}
	data := make([]map[string]any, len(rows))
	for i, r := range rows {
		data[i] = view(r)
	}
	out := map[string]any{"object": "list", "data": data, "has_more": more}
	if len(rows) > 0 {
		out["last_id"] = cursor(rows[len(rows)-1])
	}
	return out
}

// User is a user with their overrides (null when the plan decides) and effective terms.
func (v Views) User(d holds.UserDetail) map[string]any {
	c := v.Credits
	out := map[string]any{
		"object": "user", "id": d.ID, "name": d.Name, "plan": d.Plan, "disabled": d.DisabledAt != nil,
		"prepaid": c(d.PrepaidMicro), "created_at": d.CreatedAt,
		"overrides": map[string]any{"allowance": optCredits(v, d.AllowanceMicro), "max_in_flight": d.MaxInFlight,
			"discount_bp": d.DiscountBP},
		"effective": map[string]any{"allowance": c(d.Effective.AllowanceMicro), "hold_normal": c(d.Effective.HoldNormalMicro),
			"hold_heavy": c(d.Effective.HoldHeavyMicro), "heavy_after_turns": d.Effective.HeavyAfterTurns,
			"max_in_flight": d.Effective.MaxInFlight, "max_run_cost": c(d.Effective.MaxRunCostMicro),
			"discount_bp": d.Effective.DiscountBP},
	}
	if d.DisabledAt != nil {
		out["disabled_at"] = *d.DisabledAt
	}
	return out
}

func optCredits(v Views, micro *int64) any {
	if micro == nil {
		return nil
	}
	return v.Credits(*micro)
}

// Key is a key as lists show it: its id and prefix, never the key.
func (v Views) Key(k holds.KeyInfo) map[string]any {
	out := map[string]any{"object": "api_key", "id": k.ID, "prefix": k.Prefix, "created_at": k.CreatedAt, "revoked": k.RevokedAt.Valid}
	if k.RevokedAt.Valid {
		out["revoked_at"] = k.RevokedAt.Time
	}
	return out
}

// Grant is one grant; replayed marks the answer to a repeated idempotency key.
func (v Views) Grant(user string, g holds.Grant, replayed bool) map[string]any {
	return map[string]any{"object": "grant", "id": g.ID, "user": user, "amount": v.Credits(g.AmountMicro),
		"prepaid_after": v.Credits(g.BalanceAfterMicro), "idempotency_key": g.IdempotencyKey, "reason": g.Reason,
		"created_at": g.CreatedAt, "replayed": replayed}
}

// Instance is a gateway process's row: its state (alive, silent, dead, retired), when it
// started and last beat, and, once they happened, when it was declared dead (or retired) and
// when every hold it left was brought in.
func (v Views) Instance(in holds.InstanceRow) map[string]any {
	out := map[string]any{"object": "instance", "id": in.ID, "name": in.Name, "state": in.State(),
		"started_at": in.StartedAt, "beat_at": in.BeatAt}
	if in.DeadAt.Valid {
		out["dead_at"] = in.DeadAt.Time
	}
	if in.SweptAt.Valid {
		out["swept_at"] = in.SweptAt.Time
	}
	return out
}

// GrantBelowZero words a refused refund in credits, as the grant was asked in.
func (v Views) GrantBelowZero(e *holds.GrantBelowZeroError) string {
	c := func(m int64) string { return pricing.FormatCredits(m, v.CreditMicro) }
	if e.HeldMicro > 0 {
		return fmt.Sprintf("a grant of %s credits would leave less than the user's calls in flight hold beyond today's allowance (%s credits of the %s credits prepaid); wait for them to end, or disable the user first",
			c(e.AmountMicro), c(e.HeldMicro), c(e.PrepaidMicro))
	}
	return fmt.Sprintf("a grant of %s credits would take prepaid credits below zero: the user has %s credits prepaid", c(e.AmountMicro), c(e.PrepaidMicro))
}

// Balance is what GET /v1/credits shows the user, plus what only an operator needs.
func (v Views) Balance(d holds.UserDetail, b holds.Balance) map[string]any {
	c := v.Credits
	return map[string]any{"object": "credits", "user": d.Name, "plan": b.Plan, "disabled": d.DisabledAt != nil,
		"allowance": c(b.AllowanceMicro), "used_today": c(b.UsedTodayMicro), "held": c(b.HeldMicro),
		"spent_in_runs": c(b.SpentInRunsMicro), "prepaid": c(b.PrepaidMicro), "available": c(b.AvailableMicro), "in_flight": b.InFlight,
		"day": b.Day.Format(time.DateOnly)}
}

// Run is a run as an operator lists it.
func (v Views) Run(r holds.UserRun) map[string]any {
	c := v.Credits
	out := map[string]any{"object": "run", "id": r.RunID, "user": r.UserName, "state": r.State, "model": r.Model,
		"held": c(r.HeldMicro), "cap": c(r.CapMicro), "discount_bp": r.DiscountBP,
		"created_at": r.CreatedAt, "expires_at": r.ExpiresAt,
		"usage": r.Usage().RunCounts(int64(r.Calls))}
	if r.ClientRunID.Valid {
		out["name"] = r.ClientRunID.String
	}
	if r.State == holds.StateSettled {
		out["cost"] = c(r.CostMicro)
		out["charged"] = c(r.ChargedMicro)
		out["allowance_part"] = c(r.AllowancePart)
		out["prepaid_part"] = c(r.PrepaidPart)
		out["estimated"] = r.Estimated
		out["settle_source"] = r.SettleSource.String
		out["settled_at"] = r.SettledAt.Time
	}
	return out
}

func (v Views) usageRow(r holds.UsageRow) map[string]any {
	c := v.Credits
	return map[string]any{"user": r.UserName, "day": r.Day, "model": r.Model, "runs": r.Runs, "charged_runs": r.ChargedRuns,
		"estimated_runs": r.EstimatedRuns,
		"calls":          r.Calls, "input_tokens": r.InTok, "cache_read_tokens": r.CacheReadTok, "cache_write_tokens": r.CacheWriteTok,
		"output_tokens": r.OutTok, "cache_write_1h_tokens": r.CacheWrite1hTok, "audio_input_tokens": r.AudioInTok,
		"audio_output_tokens": r.AudioOutTok, "cost": c(r.CostMicro), "charged": c(r.ChargedMicro),
		"allowance_part": c(r.AllowancePartMicro), "prepaid_part": c(r.PrepaidPartMicro)}
}

// Report is the usage report as JSON: rows by user, day and model, their totals, and the day
// ledger over the same range, which the totals' charged and charged_runs equal.
func (v Views) Report(rep holds.UsageReport) map[string]any {
	rows := make([]map[string]any, len(rep.Rows))
	for i, r := range rep.Rows {
		rows[i] = v.usageRow(r)
	}
	totals := v.usageRow(rep.Totals)
	delete(totals, "user")
	delete(totals, "day")
	delete(totals, "model")
	return map[string]any{"object": "usage_report", "from": rep.From, "to": rep.To, "data": rows, "totals": totals,
		"ledger": map[string]any{"charged": v.Credits(rep.LedgerMicro), "charged_runs": rep.LedgerRuns}}
}

// ReportCSVHeader names the CSV report's columns.
var ReportCSVHeader = []string{"user", "day", "model", "runs", "charged_runs", "calls", "input_tokens",
	"cache_read_tokens", "cache_write_tokens", "output_tokens", "cost", "charged", "allowance_part", "prepaid_part",
	// Columns added after the others come last, so that they keep their places in existing
	// imports: the runs charged an estimate, then the parts of the token totals a provider's
	// invoice lists apart.
	"estimated_runs", "cache_write_1h_tokens", "audio_input_tokens", "audio_output_tokens"}

// WriteReportCSV writes the report's rows as CSV with a header and no totals row, so a
// spreadsheet's own sums are not doubled. Credits are exact decimals.
func (v Views) WriteReportCSV(w io.Writer, rep holds.UsageReport) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(ReportCSVHeader); err != nil {
		return fmt.Errorf("csv header: %w", err)
	}
	i := func(n int64) string { return strconv.FormatInt(n, 10) }
	c := func(m int64) string { return pricing.FormatCredits(m, v.CreditMicro) }
	for _, r := range rep.Rows {
		rec := []string{cellText(r.UserName), r.Day, cellText(r.Model), i(r.Runs), i(r.ChargedRuns), i(r.Calls), i(r.InTok),
			i(r.CacheReadTok), i(r.CacheWriteTok), i(r.OutTok), c(r.CostMicro), c(r.ChargedMicro),
			c(r.AllowancePartMicro), c(r.PrepaidPartMicro), i(r.EstimatedRuns), i(r.CacheWrite1hTok), i(r.AudioInTok),
			i(r.AudioOutTok)}
		if err := cw.Write(rec); err != nil {
			return fmt.Errorf("csv row: %w", err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("csv: %w", err)
	}
	return nil
}

// cellText keeps a text cell from being read as a formula by a spreadsheet (CSV injection):
// a leading = + - @ gets a quote in front. Numbers are written by this package and never
// pass through here.
func cellText(s string) string {
	if s != "" && (s[0] == '=' || s[0] == '+' || s[0] == '-' || s[0] == '@' || s[0] == '\t' || s[0] == '\r') {
		return "'" + s
	}
	return s
}
