package proxy

import "context"

// IdempotentRunID is the run id of attempt n of an Idempotency-Key.
var IdempotentRunID = idempotentRunID

// WaitSettlements waits, without closing anything, until no call is in flight and every
// settlement started so far has finished: tests go on calling after it.
func (s *Server) WaitSettlements(ctx context.Context) error {
	if err := s.calls.wait(ctx); err != nil {
		return err
	}
	return s.settlements.wait(ctx)
}
