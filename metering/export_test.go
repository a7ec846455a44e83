package metering

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
