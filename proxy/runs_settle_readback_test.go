package proxy_test

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/pricing"
)

// runReadMarker is what only Store.Run's statement contains: the read of a run by id, which a
// settle on request makes before its settlement and again after it.
const runReadMarker = "AS read_at FROM run_holds WHERE run_id"

// TestSettleWhoseReadBackFailsSaysTheRunIsSettled: POST /v1/runs/{id}/settle commits the
// run's settlement and then reads the run back to show it. When that read failed (the
// database gone the moment after the COMMIT), the caller was told 503 "Billing is
// unavailable, so the call was not made" — for a run that was settled and charged, as a
// retried settle or GET then showed. An agent told nothing happened may go on working on a
// run it can no longer use, or report its task unbilled. The answer now says the run is
// settled, what it was charged, and where to read it.
func TestSettleWhoseReadBackFailsSaysTheRunIsSettled(t *testing.T) {
	h, lossy := newLossyHarness(t)
	// The settlement's own commit is told to the store's hook, after it committed and before
	// the settle reads the run back: the database goes down in between.
	var armed atomic.Bool
	h.store.OnSettled(func(st holds.Settlement, _ holds.Settled) {
		if st.Source == holds.SourceClient && armed.CompareAndSwap(false, true) {
			lossy.Arm(runReadMarker, testenv.GoDown)
		}
	})
	u, key := h.user("standard")
	runID := firstRunCall(t, h, key, map[string]string{"X-Run-Id": "task-readback"}, 5)

	status, body := h.settleRun(key, "task-readback")
	down := lossy.Down()
	lossy.Restore()
	if !down {
		t.Fatal("the settle's read-back never lost the database")
	}
	r := h.run(u.ID, runID)
	if r.State != holds.StateSettled || r.ChargedMicro == 0 {
		t.Fatalf("run %s charged %d µUSD, want settled and charged", r.State, r.ChargedMicro)
	}
	msg := errorMessage(t, body)
	if status != http.StatusServiceUnavailable || errorCode(t, body) != "billing_unavailable" ||
		!strings.Contains(msg, "was settled") || strings.Contains(msg, "not made") {
		t.Fatalf("settle that committed, its read-back failed: %d %s; want 503 saying the run was settled", status, body)
	}
	if want := "charged " + pricing.FormatCredits(r.ChargedMicro, h.cfg.CreditMicro) + " credits"; !strings.Contains(msg, want) {
		t.Errorf("message %q does not say %q", msg, want)
	}
	settledOnRetry(t, h, key, "task-readback")
}

// TestSettleWhoseCommitWentUnansweredSaysItMayHaveSettled: a settle whose settlement's
// COMMIT went out and was never answered (the database gone with it) may have settled the
// run — README: "one whose commit went out unanswered may have charged". It was told 503
// "Billing is unavailable, so the call was not made", which reads as nothing charged. The
// answer now says the run may be settled and how to find out.
func TestSettleWhoseCommitWentUnansweredSaysItMayHaveSettled(t *testing.T) {
	h, lossy := newLossyHarness(t)
	u, key := h.user("standard")
	runID := firstRunCall(t, h, key, map[string]string{"X-Run-Id": "task-commit-lost"}, 5)

	status, body := settleLosingDB(t, h, lossy, key, "task-commit-lost", ";\nCOMMIT", "the settlement's commit never lost the database")
	if r := h.run(u.ID, runID); r.State != holds.StateSettled {
		t.Fatalf("run %s: the settlement's commit was meant to land", r.State)
	}
	msg := errorMessage(t, body)
	if status != http.StatusServiceUnavailable || errorCode(t, body) != "billing_unavailable" ||
		!strings.Contains(msg, "may be settled") || strings.Contains(msg, "not made") {
		t.Fatalf("settle whose commit went unanswered: %d %s; want 503 saying the run may be settled", status, body)
	}
	settledOnRetry(t, h, key, "task-commit-lost")
}

// TestSettleThatCannotReadTheRunSaysItChargedNothing: a settle refused because billing is unavailable
// (here the database gone as it reads the run) charged nothing, but was told "the call was not
// made", which leaves an agent unsure what became of its run. It now says the settle charged
// nothing (not that the run is unsettled: unread, it may be, see
// TestSettleRetriedAfterAnUnansweredCommitDoesNotSayNotSettled); settled again once the
// database is back, it is.
func TestSettleThatCannotReadTheRunSaysItChargedNothing(t *testing.T) {
	h, lossy := newLossyHarness(t)
	u, key := h.user("standard")
	runID := firstRunCall(t, h, key, map[string]string{"X-Run-Id": "task-not-settled"}, 5)

	status, body := settleLosingDB(t, h, lossy, key, "task-not-settled", runReadMarker, "the settle never lost the database")
	if r := h.run(u.ID, runID); r.State == holds.StateSettled {
		t.Fatalf("run settled with the database gone at its first read")
	}
	msg := errorMessage(t, body)
	if status != http.StatusServiceUnavailable || errorCode(t, body) != "billing_unavailable" ||
		!strings.Contains(msg, "charged nothing") || strings.Contains(msg, "not made") {
		t.Fatalf("settle with the database gone: %d %s; want 503 saying the settle charged nothing", status, body)
	}
	settledOnRetry(t, h, key, "task-not-settled")
}

// TestSettleRetriedAfterAnUnansweredCommitDoesNotSayNotSettled: a settle whose COMMIT went
// unanswered is told the run may be settled and to settle again. When that retry could not
// read the run (billing still unavailable), it was told "the run was not settled and nothing
// was charged" — of a run the first settle had settled and charged. A settle that cannot read
// the run knows only that it did nothing itself, and says so.
func TestSettleRetriedAfterAnUnansweredCommitDoesNotSayNotSettled(t *testing.T) {
	h, lossy := newLossyHarness(t)
	u, key := h.user("standard")
	runID := firstRunCall(t, h, key, map[string]string{"X-Run-Id": "task-retry-unread"}, 5)

	lossy.Arm(";\nCOMMIT", testenv.GoDown)
	status, body := h.settleRun(key, "task-retry-unread")
	down := lossy.Down()
	lossy.Restore()
	if !down || status != http.StatusServiceUnavailable {
		t.Fatalf("the settlement's commit never lost the database: %d %s", status, body)
	}
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.ChargedMicro == 0 {
		t.Fatalf("run %s charged %d µUSD: the settlement's commit was meant to land", r.State, r.ChargedMicro)
	}

	status, body = settleLosingDB(t, h, lossy, key, "task-retry-unread", runReadMarker, "the retried settle never lost the database")
	msg := errorMessage(t, body)
	if status != http.StatusServiceUnavailable || errorCode(t, body) != "billing_unavailable" ||
		strings.Contains(msg, "not settled") || strings.Contains(msg, "nothing was charged") || strings.Contains(msg, "not made") {
		t.Fatalf("retried settle of a settled run, its read failed: %d %s; want 503 not saying the run is unsettled", status, body)
	}
	if !strings.Contains(msg, "may") {
		t.Errorf("message %q does not say the run may be settled", msg)
	}
	settledOnRetry(t, h, key, "task-retry-unread")
}

// settleLosingDB settles the named run with the database going down at the statement that
// contains marker, and fails the test (saying what) unless it went down.
func settleLosingDB(t *testing.T, h *harness, lossy *testenv.Lossy, key, name, marker, what string) (int, []byte) {
	t.Helper()
	lossy.Arm(marker, testenv.GoDown)
	status, body := h.settleRun(key, name)
	down := lossy.Down()
	lossy.Restore()
	if !down {
		t.Fatal(what)
	}
	return status, body
}

// settledOnRetry settles the named run again, the database back, and fails the test unless
// the answer shows it settled.
func settledOnRetry(t *testing.T, h *harness, key, name string) {
	t.Helper()
	if status, body := h.settleRun(key, name); status != http.StatusOK || !strings.Contains(string(body), `"state":"settled"`) {
		t.Fatalf("settle retried: %d %s", status, body)
	}
}
