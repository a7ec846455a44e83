package runstate

import "context"

// Reserve is ReserveAtMost for a run with any number of calls in flight and no spending known
// elsewhere: what most tests of the budget's arithmetic need.
func (b *RunBudget) Reserve(ctx context.Context, runID, callID string, budget, want, least int64) (int64, error) {
	return b.ReserveAtMost(ctx, runID, callID, budget, want, least, 0, 0)
}

// Held is the number of reservations this process beats.
func (b *RunBudget) Held() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.calls)
}

// ParseMemoryInfo reads the memory fields of an INFO reply.
var ParseMemoryInfo = parseMemoryInfo

// NextBeat numbers a heartbeat, as Refresh does.
func (l *Leases) NextBeat() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nextBeat()
}
