package metering

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

// EstimateInputTokens is EstimatePrompt's input estimate, with a look for audio of its own.
func EstimateInputTokens(f Format, body []byte) int64 {
	return estimateInput(f, body, f == FormatChat && mayHoldAudio(body))
}

// EstimateAudioInputTokens is EstimatePrompt's audio estimate, with a look for audio of its own.
func EstimateAudioInputTokens(f Format, body []byte) int64 {
	if f != FormatChat && f != FormatResponses {
		return 0 // no audio parts in the other formats: not even a scan of the body
	}
	return estimateAudio(f, body, mayHoldAudio(body))
}
