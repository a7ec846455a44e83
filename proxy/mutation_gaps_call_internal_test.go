package proxy

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// TestAdmitErrorAnswersEachRefusal: each refusal of an admission has its own answer. Those
// parseCall refuses first (a model name not UTF-8) or that only a store in trouble gives are
// still answered by what they are, not as billing down (503, Retry shortly): a retried call
// refused for its model, or for a run that is settled or unknown, is refused again.
func TestAdmitErrorAnswersEachRefusal(t *testing.T) {
	s := fuzzServer(t)
	for _, tc := range []struct {
		err    error
		status int
		code   string
	}{
		{fmt.Errorf("admit: %w", holds.ErrInvalidModel), http.StatusBadRequest, "invalid_model"},
		{fmt.Errorf("admit: %w", holds.ErrRunSettled), errRunSettled.Status, errRunSettled.Code},
		{fmt.Errorf("admit: %w", holds.ErrRunNotFound), errRunNotFound.Status, errRunNotFound.Code},
		{fmt.Errorf("admit: %w", holds.ErrUnknownUser), errBadKey.Status, errBadKey.Code},
		{fmt.Errorf("admit: %w", holds.ErrUserDisabled), errBadKey.Status, errBadKey.Code},
		{errUnfitReleased, errPromptOverCap.Status, errPromptOverCap.Code},
		{errUnfitNotReleased, errBillingDown.Status, errBillingDown.Code},
	} {
		if e := s.admitError(tc.err); e.Status != tc.status || e.Code != tc.code {
			t.Errorf("admission refused with %v: answered %d %s, want %d %s", tc.err, e.Status, e.Code, tc.status, tc.code)
		}
	}
}

// TestInFlightMessageCountsOpenRunsAmongTheCallsInFlight: the refusal past max_in_flight says
// how many of the holds in flight are open named runs, and never more of them than the holds in
// flight it names, whatever counts the refusal carries (bounded by min in the message).
func TestInFlightMessageCountsOpenRunsAmongTheCallsInFlight(t *testing.T) {
	msg := inFlightMessage(&holds.TooManyInFlightError{InFlight: 2, OpenRuns: 3, Limit: 2})
	if !strings.Contains(msg, "2 of them named runs") {
		t.Errorf("refusal with 2 holds in flight and 3 open runs counted: %q; want 2 of them named runs", msg)
	}
}
